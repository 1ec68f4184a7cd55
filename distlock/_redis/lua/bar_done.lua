-- The last party of a generation ran the action: trip the generation, or break the barrier
-- when the action raised.
-- KEYS[1..4]  state, waiters, broken generations, channel (see _bar.lua)
-- ARGV[1]  the runner's id
-- ARGV[2]  its generation
-- ARGV[3]  '1' when the action returned, '0' when it raised
-- ARGV[4]  how long a broken generation is remembered, ms
-- return   1 tripped; -1 broken (by the action's failure, or before: the runner's lease ran
--          out, or the barrier was aborted or reset while the action ran).
--@ uses bar_break bar_trip bar_settle
local st = redis.call('hmget', KEYS[1], 'a', 'ar')
if st[1] ~= ARGV[2] or st[2] ~= ARGV[1] then
  return -1
end
if ARGV[3] == '1' then
  bar_trip(ARGV[2])
  bar_settle()
  return 1
end
bar_break(ARGV[2], ARGV[4])
return -1
