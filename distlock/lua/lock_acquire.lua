-- Acquire, or re-enter, an exclusive owner-counted hold (DistLock, DistRLock).
-- KEYS[1]  lock hash: owner -> count, ':t' -> fencing token, ':i' -> holder info
-- KEYS[2]  fence: last token granted for this name
-- ARGV[1]  owner id
-- ARGV[2]  lease, ms
-- ARGV[3]  count to add (1 for acquire(); the saved count for _acquire_restore())
-- ARGV[4]  holder info (host:pid), kept for `distlock status`
-- ARGV[5]  '' for a new hold; for a re-entry, the token of the hold the caller believes it has
-- return   token (> 0) when granted or re-entered;
--          0 when the re-entered hold is gone or is someone else's (the caller's lease is lost);
--          -(pttl + 1) (<= -1) when someone else holds it, pttl its remaining lease in ms
--          (0 when unknown).
local lease = tonumber(ARGV[2])
if ARGV[5] ~= '' then
  if redis.call('hget', KEYS[1], ':t') ~= ARGV[5] or redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
    return 0
  end
  redis.call('hincrby', KEYS[1], ARGV[1], tonumber(ARGV[3]))
  if redis.call('pttl', KEYS[1]) < lease then
    redis.call('pexpire', KEYS[1], lease)
  end
  return tonumber(ARGV[5])
end
if redis.call('exists', KEYS[1]) == 1 then
  return held_reply(KEYS[1])
end
local token = next_token(KEYS[2])
redis.call('hset', KEYS[1], ARGV[1], ARGV[3], ':t', string.format('%.0f', token), ':i', ARGV[4])
redis.call('pexpire', KEYS[1], lease)
return token
