-- Set an event: every waiter that waits now, anywhere, is taken off the waiters and named in
-- one hint, so it returns True without another look, even if clear() comes first.
-- KEYS[1]  flag: string '1', exists while the event is set
-- KEYS[2]  waiters: sorted set, waiter id -> entry deadline (server ms)
-- KEYS[3]  the event's wake-up channel
-- KEYS[4]  taken: sorted set, waiter id -> entry deadline, the entries this set() took, until
--          their waiters look; a waiter that finds its entry gone returns True only if it is
--          here, so a restart that lost the data (which removes entries too) is not a set()
-- KEYS[5...]  the keys of the kinds that may not share the name (wrong_kind, _prelude.lua)
-- return   1 when this call set the event; 0 when it was set already (nobody waits then).
-- Entries whose deadline passed (a waiter that died) are left for the key's TTL: they are not
-- woken, and their waiters, should they come back, know their entry ran out (ev_wait).
--@ uses wrong_kind
local wrong = wrong_kind('E', 'LWSB', 5)  -- a name is one lock
if wrong then
  return wrong
end
if redis.call('exists', KEYS[1]) == 1 then
  return 0
end
redis.call('set', KEYS[1], '1')
local t = redis.call('time')
local live = '(' .. string.format('%.0f', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local entries = redis.call('zrangebyscore', KEYS[2], live, '+inf', 'WITHSCORES')
local taken = {}
if #entries > 0 then
  local last = 0
  for i = 1, #entries, 2 do
    taken[#taken + 1] = entries[i]
    redis.call('zadd', KEYS[4], entries[i + 1], entries[i])
    last = math.max(last, tonumber(entries[i + 1]))
  end
  if redis.call('pttl', KEYS[4]) < last - tonumber(string.sub(live, 2)) then
    redis.call('pexpireat', KEYS[4], string.format('%.0f', last))
  end
  redis.call('zremrangebyscore', KEYS[2], live, '+inf')
  if #taken <= 200 then
    redis.call('publish', KEYS[3], '=' .. table.concat(taken, ','))
  else
    redis.call('publish', KEYS[3], '*')  -- too many to name: each looks, and finds it was taken
  end
end
return 1
