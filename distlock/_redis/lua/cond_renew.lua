-- Renew the leases of one process' waiters on one condition (session watchdog, batched): only
-- the waiters still there; one that is gone is never put back.
-- KEYS[1]  queue: sorted set, waiter id -> arrival
-- KEYS[2]  leases: sorted set, waiter id -> lease deadline (server clock, ms)
-- ARGV[1]  lease, ms
-- ARGV[2...]  waiter ids
-- return   1, always: a waiter that is gone finds out by itself at its next look (a renewal
--          racing a waiter's own exit is no loss to report).
if #ARGV < 2 or redis.call('exists', KEYS[2]) == 0 then
  return 1
end
local t = redis.call('time')
local deadline = string.format('%.0f', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  + tonumber(ARGV[1]))
local args = {}
for i = 2, #ARGV do
  args[#args + 1] = deadline
  args[#args + 1] = ARGV[i]
end
for i = 1, #args, 2000 do
  redis.call('zadd', KEYS[2], 'XX', unpack(args, i, math.min(i + 1999, #args)))
end
local top = redis.call('zrange', KEYS[2], -1, -1, 'WITHSCORES')
redis.call('pexpireat', KEYS[1], top[2])
redis.call('pexpireat', KEYS[2], top[2])
return 1
