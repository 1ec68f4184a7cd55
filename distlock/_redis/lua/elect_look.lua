-- Read who leads an election (DistElection): the exclusive hold of the name, with its holder
-- info ('host:pid', then ' ' and the leader's value, percent-encoded); optionally publish it.
-- KEYS[1]  lock hash (see lock_acquire)
-- KEYS[2]  the election's channel: '*', a hint that the leader changed (every observer looks)
-- ARGV[1]  '1': publish what was read on KEYS[2] (a new leader, or a resignation, says so)
-- return   {token, info, pttl}: the hold's fencing token ('0' when nobody holds the name, or
--          when it is kept for a waiting process only), its holder info ('' when unknown) and
--          its remaining lease in ms (-2: no hold).
local h = redis.call('hmget', KEYS[1], ':t', ':i')
local token, info, pttl = h[1] or '0', h[2] or '', -2
if h[1] then
  pttl = redis.call('pttl', KEYS[1])
end
if ARGV[1] == '1' then
  redis.call('publish', KEYS[2], '*')  -- every observer of every process looks
end
return {token, info, pttl}
