-- What a barrier looks like now (a dead party found here breaks it, as in every bar_* script).
-- KEYS[1..4]  state, waiters, broken generations, channel (see _bar.lua)
-- ARGV[1]  how long a broken generation is remembered, ms
-- return   {broken (1 or 0), parties waiting in the current generation (0 while broken)}
--@ uses bar_reap
local st = redis.call('hmget', KEYS[1], 'g', 'b')
if not st[1] then
  return {0, 0}
end
if st[2] ~= '1' and bar_reap(st[1], ARGV[1]) then
  return {1, 0}
end
if st[2] == '1' then
  return {1, 0}
end
return {0, redis.call('zcard', KEYS[2])}
