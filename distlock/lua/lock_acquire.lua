-- Acquire, or re-enter, an exclusive owner-counted hold (DistLock, DistRLock).
-- KEYS[1]  lock hash: owner -> count, ':t' -> fencing token, ':i' -> holder info,
--          ':w' -> present when someone waits (the release then publishes a wake-up)
-- KEYS[2]  fence: last token granted for this name
-- ARGV[1]  owner id
-- ARGV[2]  lease, ms
-- ARGV[3]  holder info (host:pid), kept for `distlock status`
-- ARGV[4]  mode: absent or '' for a first try; 'w' for a try by a waiter (queued for
--          wake-ups); otherwise the token of the hold the caller believes it has (re-entry)
-- ARGV[5]  count to add; absent means 1 (the saved count for _acquire_restore())
-- return   token (> 0) when granted or re-entered;
--          0 when the re-entered hold is gone or is someone else's (the caller's lease is lost);
--          -(pttl + 1) (<= -1) when someone else holds it, pttl its remaining lease in ms
--          (0 when unknown); the hold is then flagged so that its release publishes.
local lease = tonumber(ARGV[2])
local mode = ARGV[4] or ''
local count = ARGV[5] or '1'
if mode ~= '' and mode ~= 'w' then
  if redis.call('hget', KEYS[1], ':t') ~= mode or redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
    return 0
  end
  redis.call('hincrby', KEYS[1], ARGV[1], tonumber(count))
  if redis.call('pttl', KEYS[1]) < lease then
    redis.call('pexpire', KEYS[1], lease)
  end
  return tonumber(mode)
end
if redis.call('exists', KEYS[1]) == 1 then
  redis.call('hset', KEYS[1], ':w', 1)
  return held_reply(KEYS[1])
end
local token = next_token(KEYS[2])
if mode == 'w' then
  -- granted to a waiter: others of its process may still wait, so its release must publish
  redis.call('hset', KEYS[1], ARGV[1], count, ':t', string.format('%.0f', token), ':i', ARGV[3], ':w', 1)
else
  redis.call('hset', KEYS[1], ARGV[1], count, ':t', string.format('%.0f', token), ':i', ARGV[3])
end
redis.call('pexpire', KEYS[1], lease)
return token
