-- The assembled rw_write_acquire script of the previous release (distlock b49bc5c), kept to test that
-- a process of that release and one of this release exclude each other on the same name.
-- Produced with that release's own loader, distlock._scripts.script_source('rw_write_acquire'),
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
-- Acquire, or re-enter, the write side of a read/write lock; queue or unqueue the caller as a
-- waiting writer in the same step.
-- KEYS[1]  writer hash: owner -> count, ':t' -> token, ':i' -> holder info, ':r' -> readers wait
-- KEYS[2]  readers: sorted set, '<owner>#<token>' -> lease deadline (server ms)
-- KEYS[3]  waiting writers: sorted set, owner -> entry deadline (server ms)
-- KEYS[4]  fence: last token granted for this name
-- KEYS[5]  readers' wake-up channel (mode 'x' only)
-- ARGV[1]  owner id
-- ARGV[2]  lease, ms
-- ARGV[3]  holder info (host:pid)
-- ARGV[4]  mode: absent or '' try once, never queue; 'q' first try of a wait: queue if refused;
--          'w' later try of a wait: queue (refresh the entry) if refused, leave the queue if
--          granted; 'x' last try of a wait: leave the queue either way; otherwise the token of
--          the hold the caller believes it has (re-entry)
-- ARGV[5]  modes 'q' and 'w': the queue entry's lease, ms (ignored otherwise)
-- ARGV[6]  count to add; absent means 1 (the saved count for _acquire_restore())
-- return   token (> 0) when granted or re-entered;
--          0 when the re-entered hold is gone or is someone else's (the caller's lease is lost);
--          -(bound + 1) (<= -1) when refused: another writer holds it (bound = its PTTL) or
--          readers do (bound = ms until the earliest live reader's lease runs out).
-- A writer that leaves the queue as the last live waiting writer wakes the readers.
local owner, lease, mode, count = ARGV[1], tonumber(ARGV[2]), ARGV[4] or '', ARGV[6] or '1'
if mode ~= '' and mode ~= 'q' and mode ~= 'w' and mode ~= 'x' then
  local f = redis.call('hmget', KEYS[1], owner, ':t')
  if not f[1] or f[2] ~= mode then
    return 0
  end
  redis.call('hincrby', KEYS[1], owner, tonumber(count))
  if redis.call('pttl', KEYS[1]) < lease then
    redis.call('pexpire', KEYS[1], lease)
  end
  return tonumber(mode)
end

local now = nil
local function clock()
  if now == nil then
    local t = redis.call('time')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return now
end

local refused = nil
if redis.call('exists', KEYS[1]) == 1 then
  refused = held_reply(KEYS[1])
else
  local last = redis.call('zrange', KEYS[2], -1, -1, 'withscores')
  if #last > 0 then
    if tonumber(last[2]) > clock() then
      local first = redis.call('zrangebyscore', KEYS[2], '(' .. string.format('%.0f', now), '+inf',
                               'withscores', 'limit', 0, 1)
      refused = -(math.max(1, tonumber(first[2]) - now) + 1)
    else
      -- no live reader: every one left ran out of lease (its process died)
      redis.call('del', KEYS[2])
    end
  end
end

if refused ~= nil then
  if mode == 'q' or mode == 'w' then
    local wait = tonumber(ARGV[5])
    redis.call('zadd', KEYS[3], string.format('%.0f', clock() + wait), owner)
    if redis.call('pttl', KEYS[3]) < wait then
      redis.call('pexpire', KEYS[3], wait)
    end
  elseif mode == 'x' and redis.call('zrem', KEYS[3], owner) == 1 then
    if redis.call('zcount', KEYS[3], '(' .. string.format('%.0f', clock()), '+inf') == 0 then
      redis.call('del', KEYS[3])
      if redis.call('exists', KEYS[1]) == 0 then
        redis.call('publish', KEYS[5], '*')
      else
        redis.call('hset', KEYS[1], ':r', 1)  -- readers refused behind us: wake them later
      end
    end
  end
  return refused
end

local token = next_token(KEYS[4])
if mode == 'w' or mode == 'x' then
  -- a writer that waited: readers may have been refused behind it, so its release wakes them
  redis.call('hset', KEYS[1], owner, count, ':t', string.format('%.0f', token), ':i', ARGV[3], ':r', 1)
  redis.call('zrem', KEYS[3], owner)
else
  redis.call('hset', KEYS[1], owner, count, ':t', string.format('%.0f', token), ':i', ARGV[3])
end
redis.call('pexpire', KEYS[1], lease)
return token

