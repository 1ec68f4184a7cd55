-- Join a condition's waiter queue and, in the same step, release the caller's lock fully
-- (whatever its depth), so that no notify can come between the release and the join.
-- KEYS[1]  queue: sorted set, waiter id -> arrival (server clock, µs; strictly increasing):
--          the waiters no notify has picked yet
-- KEYS[2]  leases: sorted set, waiter id -> lease deadline (server clock, ms), for the same
--          waiters
-- KEYS[3]  lock hash (only when ARGV[3] is not ''): owner -> count, ':t' -> token,
--          ':w' -> present when processes may wait for the lock (then the release wakes one)
-- KEYS[4]  the lock's registry of waiting processes (only when ARGV[3] is not '')
-- ARGV[1]  waiter id
-- ARGV[2]  waiter lease, ms (the session watchdog renews it)
-- ARGV[3]  lock owner id, or '' when the caller releases its lock itself (not a Dist lock)
-- ARGV[4]  token of the lock hold the caller believes it has
-- return   0 when queued (and the lock released: freed, waking one waiting process when the
--          hold was waited on, as lock_release does);
--          -1 when the lock hold is gone or someone else's (nothing changed).
--          The lock is freed as lock_release frees it (free_hold).
--@ uses free_hold
if ARGV[3] ~= '' then
  local fields = redis.call('hmget', KEYS[3], ARGV[3], ':t', ':w')
  if not fields[1] or fields[2] ~= ARGV[4] then
    return -1
  end
  free_hold(KEYS[3], KEYS[4], fields[3], '')
end
local t = redis.call('time')
local arrival = tonumber(t[1]) * 1000000 + tonumber(t[2])
local last = redis.call('zrange', KEYS[1], -1, -1, 'WITHSCORES')
if last[2] and tonumber(last[2]) >= arrival then
  arrival = tonumber(last[2]) + 1
end
local deadline = math.floor(arrival / 1000) + tonumber(ARGV[2])
redis.call('zadd', KEYS[1], string.format('%.0f', arrival), ARGV[1])
redis.call('zadd', KEYS[2], string.format('%.0f', deadline), ARGV[1])
-- Both keys live as long as the longest lease in them, so the waiters of processes that died
-- leave nothing behind for good.
local top = redis.call('zrange', KEYS[2], -1, -1, 'WITHSCORES')
redis.call('pexpireat', KEYS[1], top[2])
redis.call('pexpireat', KEYS[2], top[2])
return 0
