-- The assembled lock_acquire script of the previous release (distlock b49bc5c), kept to test that
-- a process of that release and one of this release exclude each other on the same name.
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

-- The registry of waiting processes of an exclusive lock: a sorted set whose members are the
-- wake-up channels of the processes that have threads waiting (one channel per process and
-- lock, named by the client), scored by the entry's deadline on the server clock (ms). A
-- release wakes exactly one waiting process, not every subscriber; entries of processes that
-- died expire by their deadline.

local function now_ms()
  local t = redis.call('time')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- register_waiter(queue, channel, ms): (re)enter a process' channel, at the back, for ms.
-- Every entry gets the same lease, so the newest one ends last and the registry's TTL is ms.
local function register_waiter(queue, channel, ms)
  redis.call('zadd', queue, now_ms() + ms, channel)
  redis.call('pexpire', queue, ms)
end
-- Acquire, or re-enter, an exclusive owner-counted hold (DistLock, DistRLock).
-- KEYS[1]  lock hash: owner -> count, ':t' -> fencing token, ':i' -> holder info,
--          ':w' -> present when processes may be waiting (the release then wakes one)
-- KEYS[2]  fence: last token granted for this name
-- KEYS[3]  registry of waiting processes: sorted set, wake-up channel -> entry deadline (ms)
-- ARGV[1]  owner id
-- ARGV[2]  lease, ms
-- ARGV[3]  holder info (host:pid), kept for `distlock status`
-- ARGV[4]  mode: absent or '' for a first try; 'w' for a try by a queued waiter; 'p' for a
--          queued waiter's try that, when it fails, neither registers the process nor flags the
--          hold (a waiter backing off after it lost a race: no release wakes it meanwhile);
--          otherwise the token of the hold the caller believes it has (re-entry)
-- ARGV[5]  count to add; absent means 1 (the saved count for _acquire_restore())
-- ARGV[6]  modes 'w'/'p' only: the waiter's process channel, to register when the try fails
-- ARGV[7]  modes 'w'/'p' only: registry entry lease, ms
-- ARGV[8]  modes 'w'/'p' only: '1' when other threads of the process still wait after a grant
-- return   token (> 0) when granted or re-entered;
--          0 when the re-entered hold is gone or is someone else's (the caller's lease is lost);
--          -(pttl + 1) (<= -1) when someone else holds it, pttl its remaining lease in ms
--          (0 when unknown); the hold is then flagged so that its release wakes a waiter.
local lease = tonumber(ARGV[2])
local mode = ARGV[4] or ''
local count = ARGV[5] or '1'
if mode ~= '' and mode ~= 'w' and mode ~= 'p' then
  if redis.call('hget', KEYS[1], ':t') ~= mode or redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
    return 0
  end
  redis.call('hincrby', KEYS[1], ARGV[1], tonumber(count))
  if redis.call('pttl', KEYS[1]) < lease then
    redis.call('pexpire', KEYS[1], lease)
  end
  return tonumber(mode)
end
-- One EXISTS answers the uncontended case: neither a hold nor anyone registered as waiting.
-- Otherwise PTTL tells whether the lock is held (-2: no such key) and, if so, for how long.
local present = redis.call('exists', KEYS[1], KEYS[3])
if present > 0 then
  local pttl = redis.call('pttl', KEYS[1])
  if pttl ~= -2 then
    if mode == 'w' then
      register_waiter(KEYS[3], ARGV[6], tonumber(ARGV[7]))
    end
    if mode ~= 'p' then
      redis.call('hset', KEYS[1], ':w', 1)
    end
    return held_reply(KEYS[1], pttl)
  end
end
local token = string.format('%.0f', next_token(KEYS[2]))
if present > 0 then
  -- processes are registered as waiting: this hold's release must wake the next of them
  redis.call('hset', KEYS[1], ARGV[1], count, ':t', token, ':i', ARGV[3], ':w', 1)
else
  redis.call('hset', KEYS[1], ARGV[1], count, ':t', token, ':i', ARGV[3])
end
if mode == 'w' or mode == 'p' then
  if ARGV[8] == '1' then
    register_waiter(KEYS[3], ARGV[6], tonumber(ARGV[7]))
    redis.call('hset', KEYS[1], ':w', 1)
  else
    redis.call('zrem', KEYS[3], ARGV[6])
  end
end
redis.call('pexpire', KEYS[1], lease)
return tonumber(token)

