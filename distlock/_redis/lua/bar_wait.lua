-- A party arrives at the barrier.
-- KEYS[1..4]  state, waiters, broken generations, channel (see _bar.lua)
-- KEYS[5...]  the keys of the kinds that may not share the name (wrong_kind, _prelude.lua)
-- ARGV[1]  the party's id
-- ARGV[2]  lease, ms (of its wait; of its action if it is the last party)
-- ARGV[3]  parties, as the caller's barrier was constructed
-- ARGV[4]  '1' when the caller has an action to run, else '0'
-- ARGV[5]  how long a broken generation is remembered, ms
-- return   {code, x, generation}:
--          {0, index, g}  it waits in generation g (index: how many arrived before it);
--          {1, index, g}  it was the last party, and g tripped (no action to run);
--          {2, index, g}  it was the last party: it runs the action, then calls bar_done;
--          {-1, 0, 0}     the barrier is broken;
--          {-2, bound, 0} the previous generation's action still runs: try again (bound: ms
--                         until its runner's lease ends);
--          {-3, parties, 0} the barrier is in use with another number of parties.
--@ uses fmt outlive NOW bar_next bar_trip bar_reap bar_settle wrong_kind
local wrong = wrong_kind('B', 'LWSE', 5)  -- a name is one lock
if wrong then
  return wrong
end
local st = redis.call('hmget', KEYS[1], 'p', 'g', 'b', 'a', 'ad')
local parties = tonumber(ARGV[3])
if st[1] and tonumber(st[1]) ~= parties then
  return {-3, tonumber(st[1]), 0}
end
if st[2] and st[3] ~= '1' and bar_reap(st[2], ARGV[5]) then
  return {-1, 0, 0}
end
if st[3] == '1' then
  return {-1, 0, 0}
end
if st[4] then
  return {-2, math.max(1, tonumber(st[5]) - NOW), 0}
end
local g = st[2]
if not g then
  g = bar_next(nil)
  redis.call('hset', KEYS[1], 'p', ARGV[3], 'g', g, 'o', g)
elseif not st[1] then  -- at rest after a trip (see bar_settle)
  redis.call('hset', KEYS[1], 'p', ARGV[3])
end
local index = redis.call('zcard', KEYS[2])
local deadline = NOW + tonumber(ARGV[2])
if index + 1 < parties then
  redis.call('zadd', KEYS[2], fmt(deadline), ARGV[1])
  bar_settle()
  return {0, index, tonumber(g)}
end
if ARGV[4] == '1' then
  -- The last party goes through out of memory too (TTL first, see _bar.lua): what it starts
  -- ends the generation. A party that would join needs memory, and is refused.
  outlive(KEYS[1], deadline, NOW)
  redis.call('hset', KEYS[1], 'a', g, 'ad', fmt(deadline), 'ar', ARGV[1])
  bar_settle()
  return {2, index, tonumber(g)}
end
bar_trip(g)
bar_settle()
return {1, index, tonumber(g)}
