-- Set an event: every waiter that waits now, anywhere, is taken off the waiters and named in
-- one hint, so it returns True without another look, even if clear() comes first.
-- KEYS[1]  flag: string '1', exists while the event is set
-- KEYS[2]  waiters: sorted set, waiter id -> entry deadline (server ms)
-- KEYS[3]  the event's wake-up channel
-- return   1 when this call set the event; 0 when it was set already (nobody waits then).
-- Entries whose deadline passed (a waiter that died) are left for the key's TTL: they are not
-- woken, and their waiters, should they come back, know their entry ran out (ev_wait).
if redis.call('exists', KEYS[1]) == 1 then
  return 0
end
redis.call('set', KEYS[1], '1')
local t = redis.call('time')
local live = '(' .. string.format('%.0f', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local taken = redis.call('zrangebyscore', KEYS[2], live, '+inf')
if #taken > 0 then
  redis.call('zremrangebyscore', KEYS[2], live, '+inf')
  if #taken <= 200 then
    redis.call('publish', KEYS[3], '=' .. table.concat(taken, ','))
  else
    redis.call('publish', KEYS[3], '*')  -- too many to name: each looks, and finds it was taken
  end
end
return 1
