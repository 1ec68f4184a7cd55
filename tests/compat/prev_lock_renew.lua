-- The assembled lock_renew script of the previous release (distlock b49bc5c), kept to test that
-- a process of that release and one of this release exclude each other on the same name.
-- Renew the lease of an exclusive hold, only if it is still the caller's.
-- KEYS[1]  lock hash
-- ARGV[1]  owner id
-- ARGV[2]  token of the hold the caller believes it has
-- ARGV[3]  new lease, ms
-- return   1 when renewed; 0 when the hold is gone or is someone else's (never extended then).
if redis.call('hget', KEYS[1], ':t') ~= ARGV[2] or redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
  return 0
end
redis.call('pexpire', KEYS[1], tonumber(ARGV[3]))
return 1

