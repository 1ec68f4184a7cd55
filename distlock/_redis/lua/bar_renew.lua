-- Renew the lease of a waiting party, or of the party running the action (session watchdog).
-- KEYS[1..4]  state, waiters, broken generations, channel (see _bar.lua)
-- ARGV[1]  the party's id
-- ARGV[2]  new lease, ms
-- ARGV[3]  'w' a waiting party; 'a' the party running the action
-- return   1, always: a party that is no longer there finds out at its next look (its
--          generation tripped or broke), so a renewal has no loss to report.
-- The TTL first, ZADD / HSET after, so that a renewal works out of memory (see _bar.lua): a
-- lease that ran out for want of memory would break the barrier, or let its state run out.
--@ uses fmt outlive NOW bar_settle
local deadline = NOW + tonumber(ARGV[2])
if ARGV[3] == 'w' then
  local score = redis.call('zscore', KEYS[2], ARGV[1])
  if score and tonumber(score) > NOW then
    local renewed = math.max(tonumber(score), deadline)
    outlive(KEYS[2], renewed, NOW)
    redis.call('zadd', KEYS[2], fmt(renewed), ARGV[1])
    bar_settle()
  end
else
  local st = redis.call('hmget', KEYS[1], 'ar', 'ad')
  if st[1] == ARGV[1] and tonumber(st[2]) > NOW then
    local renewed = math.max(tonumber(st[2]), deadline)
    outlive(KEYS[1], renewed, NOW)
    redis.call('hset', KEYS[1], 'ad', fmt(renewed))
    bar_settle()
  end
end
return 1
