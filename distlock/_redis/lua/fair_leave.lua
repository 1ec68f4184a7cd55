-- A fair lock's wait ends without the lock (its deadline, a cancellation, an error, a try whose
-- reply was lost): leave the queue; and if the lock was handed to this wait meanwhile, pass it
-- on to the next live waiter, or free it.
-- KEYS[1..6]  as fair_release's
-- ARGV[1]  the wait's nonce
-- ARGV[2]  fence retention, ms
-- return   2 when the wait had been handed the lock (now passed on or freed); 1 when it was
--          queued; 0 otherwise.
--@ uses fair_drop fair_pass_on
local queued = fair_drop(KEYS[3], KEYS[4], KEYS[5], ARGV[1])
local fields = redis.call('hmget', KEYS[1], ':n', ':w')
if fields[1] ~= ARGV[1] then
  return queued
end
fair_pass_on(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], tonumber(ARGV[2]), fields[2])
return 2
