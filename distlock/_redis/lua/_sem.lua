-- Helpers of the sem_* scripts (DistSemaphore, DistBoundedSemaphore); a script gets the ones
-- it uses, after those of _prelude.lua.
-- KEYS[1] of every sem_* script is the semaphore: one sorted set holding
--   permit id -> lease deadline (server ms, > 0), one member per held permit (its id,
--   '<session>:<thread>:<n>@<ms>', carries the grant time that distlock top shows: the
--   acquiring host's clock at the try that got it, so that no path reads the server's clock
--   for it), and
--   '~v' -> -(value + 1): the value the semaphore was created with,
--   '~x' -> -(extra + 1): releases beyond the permits held (threading's counter raised by
--           release() without acquire()), present only when not 0.
-- The two counters have negative scores: pruning expired permits (scores 0..now) never takes
-- them, and they are read in one range. Free permits = value + extra - live permits.
-- The key lives as long as its latest lease while extra is 0, for good while it is not, and not
-- at all at rest (nothing held, extra 0): a semaphore at rest leaves nothing in Redis.
-- A permit taken while the semaphore was at rest is scored +inf instead: its deadline is the
-- key's own expiry (the key is created with that permit's lease as its TTL, and its renewals
-- extend the TTL), so the uncontended acquire and release never read the clock. It is then the
-- only permit; every other path settles it first (sem_settle) and it becomes a plain one.

--@ helper sem_clock sem_clock_s
-- The server's clock, ms, as a number and as a string: one TIME, read by the first helper that
-- asks.
local sem_clock, sem_clock_s = nil, nil
--@ helper sem_now uses sem_clock sem_clock_s
local function sem_now()
  if not sem_clock then
    local t = redis.call('time')
    sem_clock = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    sem_clock_s = t[1] .. string.sub('00000' .. t[2], -6, -4)  -- TIME's digits, unformatted
  end
  return sem_clock, sem_clock_s
end

--@ helper sem_live uses sem_now
-- Whether a permit's score (as Redis gives it) is a live lease: +inf always is (the key
-- exists, and its expiry is the deadline), without reading the clock.
local function sem_live(score)
  return score == 'inf' or tonumber(score) > (sem_now())
end

--@ helper sem_settle uses fmt sem_now
-- Give the +inf permit, if there is one other than `except` (a caller's own placeholder), its
-- deadline: the key's expiry, now + PTTL. Called before anything that may add a permit, raise
-- the count (no TTL) or hand permits over. (The key always has a TTL while a +inf permit is in
-- it: only the count raised takes the TTL away, and that path settles first. Without one, the
-- permit is taken as expired: it would otherwise never end.)
-- Out of memory (maxmemory under noeviction), Redis refuses a script's first write when that
-- command may use memory, as ZADD may, and allows the writes after it; setting the TTL to what
-- it is first (PEXPIRE uses none) keeps releases and refused tries working then.
local function sem_settle(except)
  local found = redis.call('zrangebyscore', KEYS[1], '+inf', '+inf')
  for i = 1, #found do
    if found[i] ~= except then
      local pttl = redis.call('pttl', KEYS[1])
      if pttl >= 0 then
        redis.call('pexpire', KEYS[1], math.max(1, pttl))
      else
        redis.call('persist', KEYS[1])
      end
      redis.call('zadd', KEYS[1], 'xx', fmt(sem_now() + math.max(0, pttl)), found[i])
    end
  end
end

--@ helper sem_counters
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

--@ helper sem_prune uses sem_now
-- Remove expired permits (holders that died); return how many there were.
local function sem_prune()
  local _, now_s = sem_now()
  return redis.call('zremrangebyscore', KEYS[1], 0, now_s)
end

--@ helper sem_wake uses fmt
-- The hint for waiters when `free` permits are free, sent only while someone waits.
local function sem_wake(queue_key, channel, free)
  if free > 0 and redis.call('exists', queue_key) == 1 then
    redis.call('publish', channel, fmt(free))
  end
end

--@ helper sem_sliced
-- ZREM / ZADD with many arguments (args[from...], from 1 unless given), in slices that stay
-- below Lua's stack limit.
local function sem_sliced(cmd, key, args, step, from)
  for i = from or 1, #args, step do
    redis.call(cmd, key, unpack(args, i, math.min(i + step - 1, #args)))
  end
end

--@ helper sem_scores
-- The scores of '~v', '~x' and of ARGV[from...] in `key`, in that order (false where absent):
-- one ZMSCORE, in slices when there are many.
local function sem_scores(key, argv, from)
  local scores = redis.call('zmscore', key, '~v', '~x', unpack(argv, from, math.min(#argv, from + 997)))
  for i = from + 998, #argv, 1000 do
    local more = redis.call('zmscore', key, unpack(argv, i, math.min(i + 999, #argv)))
    for j = 1, #more do
      scores[#scores + 1] = more[j]
    end
  end
  return scores
end

--@ helper sem_release_reply
-- A release's reply: the free count, or {free, lost id, ...} when some were lost (`lost`: a
-- list, or nil for none).
local function sem_release_reply(free, lost)
  if lost and #lost > 0 then
    table.insert(lost, 1, free)
    return lost
  end
  return free
end
