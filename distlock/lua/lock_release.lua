-- Release some or all of an exclusive owner-counted hold; the last release frees the lock and
-- publishes one wake-up hint.
-- KEYS[1]  lock hash
-- KEYS[2]  wake-up channel
-- ARGV[1]  owner id
-- ARGV[2]  token of the hold the caller believes it has
-- ARGV[3]  count to release; '0' releases all of it (_release_save())
-- return   the count still held (0 when the lock is now free);
--          -1 when the hold is gone or is someone else's (the caller's lease is lost).
local count = tonumber(redis.call('hget', KEYS[1], ARGV[1]))
if count == nil or redis.call('hget', KEYS[1], ':t') ~= ARGV[2] then
  return -1
end
local n = tonumber(ARGV[3])
if n > 0 and n < count then
  return redis.call('hincrby', KEYS[1], ARGV[1], -n)
end
redis.call('del', KEYS[1])
redis.call('publish', KEYS[2], '1')
return 0
