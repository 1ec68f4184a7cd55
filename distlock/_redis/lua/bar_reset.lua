-- reset() or abort() a barrier.
-- KEYS[1..4]  state, waiters, broken generations, channel (see _bar.lua)
-- KEYS[5...]  the keys of the kinds that may not share the name (wrong_kind, _prelude.lua)
-- ARGV[1]  'r' reset: the parties waiting now raise BrokenBarrierError, and the barrier is
--          usable again (no longer broken); 'a' abort: break it, for good until reset()
-- ARGV[2]  parties, as the caller's barrier was constructed (recorded if abort finds no state)
-- ARGV[3]  how long a broken generation is remembered, ms
-- return   1
--@ uses bar_next bar_break bar_settle wrong_kind
if ARGV[1] == 'a' then
  local wrong = wrong_kind('B', 'LWSE', 5)  -- a name is one lock
  if wrong then
    return wrong
  end
end
local st = redis.call('hmget', KEYS[1], 'g', 'b', 'a', 'p')
if ARGV[1] == 'a' then
  local g = st[1]
  if not g then
    g = bar_next(nil)
    redis.call('hset', KEYS[1], 'p', ARGV[2], 'g', g, 'o', g)
  end
  bar_break(g, ARGV[3])
  if st[1] and not st[4] then  -- at rest after a trip (see bar_settle)
    redis.call('hset', KEYS[1], 'p', ARGV[2])
  end
  return 1
end
if not st[1] then
  return 1
end
if st[2] ~= '1' and (st[3] or redis.call('exists', KEYS[2]) == 1) then
  bar_break(st[1], ARGV[3])
end
redis.call('hdel', KEYS[1], 'b', 'a', 'ad', 'ar')
redis.call('del', KEYS[2])
redis.call('hset', KEYS[1], 'g', bar_next(st[1]))
bar_settle()
return 1
