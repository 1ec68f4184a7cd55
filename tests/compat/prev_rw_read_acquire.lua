-- The assembled rw_read_acquire script of the previous release (distlock b49bc5c), kept to test that
-- a process of that release and one of this release exclude each other on the same name.
-- Produced with that release's own loader, distlock._scripts.script_source('rw_read_acquire'),
-- imported from `git archive b49bc5c`: the text it sends to Redis, with this header added.
-- Shared by every script: each script gets the helpers it uses (see distlock/_scripts.py) in
-- front of it when the scripts are loaded, so that it stays one EVALSHA and one round trip.

-- fmt(x): a whole number (|x| < 2^53, as every caller passes) as Redis should get it: Lua's
-- default format would write a large one with an exponent. C's '%d' is half the cost of '%.0f'
-- but formats a C long, which may be 32 bits: larger numbers go in two parts of 9 digits or
-- fewer each.
local function fmt(x)
  if x > -1000000000 and 1000000000 > x then
    return string.format('%d', x)
  end
  local sign = ''
  if x < 0 then
    sign, x = '-', -x
  end
  local high = math.floor(x / 1000000000)
  return string.format('%s%d%09d', sign, high, x - high * 1000000000)
end

-- next_token(fence_key): the next fencing token of a name, strictly greater than every
-- token granted before, also after a restart of a server that kept nothing.
-- The counter is one INCR. When INCR finds no counter (the name's first grant, or the server
-- lost its data), the counter starts at the server's clock in microseconds (TIME) instead of
-- at 1. Earlier tokens can't be above that: each started from an earlier clock reading and grew
-- by one per grant, and grants (script runs, one at a time) take well over a microsecond each.
-- Tokens stay below 2^53, exact in Lua's doubles; the clock is stored with fmt (above).
local function next_token(fence_key)
  local token = redis.call('incr', fence_key)
  if token == 1 then
    local now = redis.call('time')
    token = tonumber(now[1]) * 1000000 + tonumber(now[2])
    redis.call('set', fence_key, fmt(token))
  end
  return token
end

-- held_reply(key, pttl): the reply "someone else holds it": -(pttl + 1), where pttl is the
-- holder's remaining lease in ms (read here unless the caller already has it), 0 when unknown
-- (no expiry). Always <= -1. A lease about to run out (PTTL 0: under 1 ms left) is reported
-- as 1 ms, not as unknown, so that its waiter tries again at once instead of sleeping the
-- whole wait cap.
local function held_reply(key, known_pttl)
  local pttl = known_pttl or redis.call('pttl', key)
  if pttl < 0 then pttl = 0 elseif pttl == 0 then pttl = 1 end
  return -(pttl + 1)
end
-- Acquire, or re-enter, the read side of a read/write lock.
-- KEYS[1]  writer hash: owner -> count, ':t' -> token, ':i' -> holder info, ':r' -> readers wait
-- KEYS[2]  readers: sorted set, '<owner>#<token>' -> lease deadline (server ms)
-- KEYS[3]  waiting writers: sorted set, owner -> entry deadline (server ms)
-- KEYS[4]  fence: last token granted for this name
-- ARGV[1]  owner id
-- ARGV[2]  lease, ms
-- ARGV[3]  absent (or '') for a new hold; for a re-entry, the token of the hold the caller
--          believes it has
-- return   token (> 0) when granted or re-entered (the reentrancy depth is the caller's to keep);
--          0 when the re-entered hold is gone or its lease ran out (the caller's lease is lost;
--          an expired member is removed);
--          -(bound + 1) (<= -1) when refused: a writer holds the lock (bound = its PTTL; the
--          writer's release will then wake the readers) or a writer is waiting (bound = ms
--          until the earliest live queue entry runs out).
-- The readers' key always keeps a TTL at least as long as its latest deadline.
local owner, lease, reentry = ARGV[1], tonumber(ARGV[2]), ARGV[3] or ''
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local function keep(member, deadline)
  redis.call('zadd', KEYS[2], string.format('%.0f', deadline), member)
  if redis.call('pttl', KEYS[2]) < deadline - now then
    redis.call('pexpire', KEYS[2], deadline - now)
  end
end

if reentry ~= '' then
  local member = owner .. '#' .. reentry
  local deadline = tonumber(redis.call('zscore', KEYS[2], member) or '0')
  if deadline <= now then
    redis.call('zrem', KEYS[2], member)
    return 0
  end
  keep(member, math.max(deadline, now + lease))
  return tonumber(reentry)
end

if redis.call('exists', KEYS[1]) == 1 then
  if redis.call('hexists', KEYS[1], owner) == 0 then
    redis.call('hset', KEYS[1], ':r', 1)
    return held_reply(KEYS[1])
  end
  -- the caller holds the write lock: a downgrade, never refused (nor queued behind writers)
else
  local first = redis.call('zrangebyscore', KEYS[3], '(' .. string.format('%.0f', now), '+inf',
                           'withscores', 'limit', 0, 1)
  if #first > 0 then
    return -(math.max(1, tonumber(first[2]) - now) + 1)
  end
end

local token = next_token(KEYS[4])
keep(owner .. '#' .. string.format('%.0f', token), now + lease)
return token

