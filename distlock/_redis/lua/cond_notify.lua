-- Notify: pick the oldest live waiters, take them off the queue and name them in one hint.
-- Waiters whose lease ran out (their process died while waiting) are dropped first, so they
-- cannot swallow a notification.
-- KEYS[1]  queue: sorted set, waiter id -> arrival; the waiters not picked yet
-- KEYS[2]  leases: sorted set, waiter id -> lease deadline (server clock, ms), same waiters
-- KEYS[3]  the condition's wake-up channel
-- ARGV[1]  how many to wake; -1 for all
-- return   the number of waiters picked (published as '=id1,id2,...'). A picked waiter is in
--          neither key any more: that is how it knows, even without the hint.
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- ZREM with many members in one call, in slices that stay below Lua's stack limit
local function zrem_all(key, members)
  for i = 1, #members, 1000 do
    redis.call('zrem', key, unpack(members, i, math.min(i + 999, #members)))
  end
end

local dead = redis.call('zrangebyscore', KEYS[2], '-inf', now)
if #dead > 0 then
  zrem_all(KEYS[1], dead)
  redis.call('zremrangebyscore', KEYS[2], '-inf', now)
end

local n = tonumber(ARGV[1])
if n == 0 then
  return 0
end
local stop = -1
if n > 0 then stop = n - 1 end
local picked = redis.call('zrange', KEYS[1], 0, stop)
if #picked == 0 then
  return 0
end
zrem_all(KEYS[1], picked)
zrem_all(KEYS[2], picked)
redis.call('publish', KEYS[3], '=' .. table.concat(picked, ','))
return #picked
