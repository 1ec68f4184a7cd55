-- A waiter joins an event's waiters, looks whether it may return, or leaves.
-- KEYS[1]  flag: string '1', exists while the event is set
-- KEYS[2]  waiters: sorted set, waiter id -> entry deadline (server ms)
-- KEYS[3]  taken: sorted set, the entries a set() took and their waiters have not seen yet
-- KEYS[4...]  the keys of the kinds that may not share the name (wrong_kind, _prelude.lua)
-- ARGV[1]  waiter id
-- ARGV[2]  'j' join; 'p' look (and refresh the entry); 'l' leave (the caller's timeout)
-- ARGV[3]  entry lease, ms ('j', 'p')
-- ARGV[4]  ('p', 'l') the deadline the caller's last 'j' or 'p' gave its entry
-- return   -1 when the event is set (the caller's entry, if any, is removed);
--          -2 when a set() took the entry (it is in KEYS[3]; taken out now): the event was set
--          while the caller waited, even if it is clear now;
--          -3 when the entry is gone without a set(): it ran out before anyone took it (the
--          caller did not look for longer than its lease), or the server lost its data; the
--          caller must join again;
--          0 when it left ('l');
--          the entry's deadline (server ms, > 0) after 'j' or 'p'.
--@ uses wrong_kind
if ARGV[2] == 'j' then
  local wrong = wrong_kind('E', 'LWSB', 4)  -- a name is one lock
  if wrong then
    return wrong
  end
end
if redis.call('exists', KEYS[1]) == 1 then
  if ARGV[2] ~= 'j' then
    redis.call('zrem', KEYS[2], ARGV[1])
    redis.call('zrem', KEYS[3], ARGV[1])
  end
  return -1
end
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- keep(deadline): the caller's entry stays until `deadline`, and the key at least as long. Out
-- of memory (maxmemory under noeviction) Redis refuses a script's first write when that command
-- may use memory, as ZADD may; a TTL write may not, so a look at an existing entry sets the TTL
-- first and still works then. (A join makes a new entry: refused out of memory, as it should.)
local function keep(deadline)
  local pttl = redis.call('pttl', KEYS[2])
  if pttl ~= -2 then
    redis.call('pexpireat', KEYS[2], string.format('%.0f', math.max(deadline, now + math.max(pttl, 0))))
  end
  redis.call('zadd', KEYS[2], string.format('%.0f', deadline), ARGV[1])
  if pttl == -2 then
    redis.call('pexpireat', KEYS[2], string.format('%.0f', deadline))
  end
  return deadline
end

if ARGV[2] == 'j' then
  return keep(now + tonumber(ARGV[3]))
end
local score = redis.call('zscore', KEYS[2], ARGV[1])
if not score then
  if redis.call('zrem', KEYS[3], ARGV[1]) == 1 then
    return -2
  end
  return -3
end
if tonumber(score) <= now then
  redis.call('zrem', KEYS[2], ARGV[1])
  return -3
end
if ARGV[2] == 'l' then
  redis.call('zrem', KEYS[2], ARGV[1])
  return 0
end
return keep(math.max(tonumber(score), now + tonumber(ARGV[3])))
