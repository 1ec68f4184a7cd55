-- A waiting party looks how its generation ended, or leaves by breaking the barrier.
-- KEYS[1..4]  state, waiters, broken generations, channel (see _bar.lua)
-- ARGV[1]  the party's id
-- ARGV[2]  its generation
-- ARGV[3]  'p' look; 'b' break the barrier if the generation is still waiting (the party's
--          timeout ran out, or it was interrupted), as threading's timeout does; 'l' leave
--          the generation still waiting, without breaking it (a cancelled asyncio party)
-- ARGV[4]  how long a broken generation is remembered, ms
-- return   0 still waiting; 3 still waiting while the last party runs the action (a timeout
--          does not break it then, as in threading, where the action holds the lock);
--          1 its generation tripped; -1 its generation broke (timeout, abort, reset, a dead
--          party, an action that raised), or nothing shows that it tripped: the state that
--          recorded it is gone (the server lost its data, or every lease in it ran out before
--          this party looked, its own included).
--@ uses bar_break bar_reap NOW
local st = redis.call('hmget', KEYS[1], 'g', 'b', 'a', 'o')
if st[1] == ARGV[2] then
  if st[2] ~= '1' and bar_reap(st[1], ARGV[4]) then
    return -1
  end
  if redis.call('zscore', KEYS[2], ARGV[1]) then
    if st[3] == ARGV[2] then
      return 3
    end
    if ARGV[3] == 'b' then
      bar_break(st[1], ARGV[4])
      return -1
    end
    if ARGV[3] == 'l' then
      redis.call('zrem', KEYS[2], ARGV[1])
      -- the last party left a generation nobody else waits in: the barrier is at rest, and
      -- its state goes (unless released parties of the last trip may still look, 'k')
      if redis.call('zcard', KEYS[2]) == 0 and st[2] ~= '1'
          and tonumber(redis.call('hget', KEYS[1], 'k') or '0') <= NOW then
        redis.call('del', KEYS[1])
      end
      return 0
    end
    return 0
  end
  -- no longer among the waiters while its generation is still the current one: it broke
  return -1
end
if redis.call('zscore', KEYS[3], ARGV[2]) then
  return -1
end
-- Its generation ended, without a break on record. It tripped if the state has been there
-- since before it began ('o'); a state made afresh since (or none) does not know it.
if st[4] and tonumber(st[4]) <= tonumber(ARGV[2]) then
  return 1
end
return -1
