-- Break a hold by force (`distlock release --force`): delete it, move the token counter on, and
-- wake every waiter. The old holder's next renewal or release finds its hold gone and reports
-- its lease as lost (LockLostError, on_lost callbacks).
-- KEYS[1]              fence: last token granted for this name
-- KEYS[2 .. 1+ARGV[2]] wake-up channels: each gets '*' (wake every waiter)
-- KEYS[2+ARGV[2] ..]   the keys that make up the hold, deleted; the first is the hash whose
--                      ':t' field is the token of the hold (the lock hash, or a read/write
--                      lock's writer hash)
-- ARGV[1]  '' to break whatever holds the lock; otherwise the token the caller saw, and the
--          hold is broken only if that hash still carries that token
-- ARGV[2]  how many channels come first in KEYS (after the fence)
-- ARGV[3]  fence TTL, ms (>= 1): the fence retention, since nothing is held afterwards
-- return   {token of the broken hold (0 when it had none, e.g. only readers), new fence value}
--          when broken; {0, 0} when nothing was held; {-1, current token} when ARGV[1] no
--          longer matches.
--@ uses next_token
local channels = tonumber(ARGV[2])
local first = channels + 2
local held = false
for i = first, #KEYS do
  if redis.call('exists', KEYS[i]) == 1 then
    held = true
  end
end
if not held then
  return {0, 0}
end
local token = redis.call('hget', KEYS[first], ':t')
if ARGV[1] ~= '' and token ~= ARGV[1] then
  return {-1, tonumber(token or '0')}
end
for i = first, #KEYS do
  redis.call('del', KEYS[i])
end
local fence = next_token(KEYS[1], ARGV[3])
for i = 2, first - 1 do
  redis.call('publish', KEYS[i], '*')
end
return {tonumber(token or '0'), fence}
