-- Undo one try of a Redlock grant on one master (DistLock, DistRLock on a list of masters)
-- whose reply was lost or did not count: the try may or may not have run here. Safe to send
-- whatever happened, and more than once: it ends only the hold that very try made.
-- KEYS[1]  lock hash (see lock_acquire)
-- KEYS[2]  registry of waiting processes (see lock_acquire)
-- ARGV[1]  owner id
-- ARGV[2]  holder info the try wrote (':i'), which names the try: no other try writes it
-- return   1 when the try's hold was here and is gone now; 0 when it was not here.
--@ uses free_hold
local fields = redis.call('hmget', KEYS[1], ARGV[1], ':i', ':w')
if not fields[1] or fields[2] ~= ARGV[2] then
  return 0
end
free_hold(KEYS[1], KEYS[2], fields[3], '')
return 1
