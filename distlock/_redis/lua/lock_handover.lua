-- Hand an exclusive hold to a new owner id, with a new lease: a hold that changes hands
-- (distlock/_primitives/handles.py). An export renames the hold's owner to the handle's, and
-- an adoption renames it to the adopter's, so each handle is used once: a second adoption, a
-- late release by handle, or a renewal still in flight for the old owner finds the hold
-- someone else's and changes nothing.
-- KEYS[1]  lock hash (see lock_acquire)
-- KEYS[2]  fence: the name's token counter, which must outlive the hold (see next_token)
-- ARGV[1]  the owner id that holds it now
-- ARGV[2]  token of the hold
-- ARGV[3]  the new owner id
-- ARGV[4]  its new lease, ms
-- ARGV[5]  fence TTL, ms: the new lease plus the fence retention
-- return   1 when handed over; 0 when the hold is gone or is someone else's (nothing changes).
--@ uses outlive_fence
if redis.call('hget', KEYS[1], ':t') ~= ARGV[2] then
  return 0
end
local count = redis.call('hget', KEYS[1], ARGV[1])
if not count then
  return 0
end
-- PEXPIRE first, then the one write that may use memory (HSET), then what frees some (HDEL):
-- out of memory, Redis refuses a script's first such write, and nothing is then half done.
local left = redis.call('pttl', KEYS[1])
local lease = tonumber(ARGV[4])
redis.call('pexpire', KEYS[1], lease)
redis.call('hset', KEYS[1], ARGV[3], count)
redis.call('hdel', KEYS[1], ARGV[1])
if left >= 0 then
  redis.call('hincrby', KEYS[1], ':l', lease - left)  -- the hold's age stays ':l' - PTTL
end
outlive_fence(KEYS[2], ARGV[5])
return 1
