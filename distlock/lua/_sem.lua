-- Helpers of the sem_* scripts (DistSemaphore, DistBoundedSemaphore), prepended after
-- _prelude.lua.
-- KEYS[1] of every sem_* script is the semaphore: one sorted set holding
--   permit id -> lease deadline (server ms, > 0), one member per held permit, and
--   '~v' -> -(value + 1): the value the semaphore was created with,
--   '~x' -> -(extra + 1): releases beyond the permits held (threading's counter raised by
--           release() without acquire()), present only when not 0.
-- The two counters have negative scores: pruning expired permits (scores 0..now) never takes
-- them, and they are read in one range. Free permits = value + extra - live permits.
-- The key lives as long as its latest lease while extra is 0, for good while it is not, and not
-- at all at rest (nothing held, extra 0): a semaphore at rest leaves nothing in Redis.

local sem_t = redis.call('time')
local NOW = tonumber(sem_t[1]) * 1000 + math.floor(tonumber(sem_t[2]) / 1000)

-- The recorded value (nil when the semaphore is at rest), the extra count, and how many
-- counter members there are.
local function sem_counters()
  local found = redis.call('zrangebyscore', KEYS[1], '-inf', '(0', 'withscores')
  local value, extra = nil, 0
  for i = 1, #found, 2 do
    local n = -tonumber(found[i + 1]) - 1
    if found[i] == '~v' then
      value = n
    else
      extra = n
    end
  end
  return value, extra, #found / 2
end

-- Remove expired permits (holders that died); return how many there were.
local function sem_prune()
  return redis.call('zremrangebyscore', KEYS[1], 0, NOW)
end

-- The hint for waiters when `free` permits are free, sent only while someone waits.
local function sem_wake(queue_key, channel, free)
  if free > 0 and redis.call('exists', queue_key) == 1 then
    redis.call('publish', channel, fmt(free))
  end
end

-- ZREM / ZADD with many arguments, in slices that stay below Lua's stack limit.
local function sem_sliced(cmd, key, args, step)
  for i = 1, #args, step do
    redis.call(cmd, key, unpack(args, i, math.min(i + step - 1, #args)))
  end
end
