-- Helpers of the bar_* scripts (DistBarrier), prepended after _prelude.lua. Every bar_* script
-- takes the same keys:
-- KEYS[1]  state: hash, 'p' -> parties, 'g' -> current generation, 'b' -> '1' while broken;
--          'o' -> the first generation this hash recorded (every generation from 'o' to 'g'
--          ended while it was there); 'k' -> until when (server ms) the parties the latest trip
--          released may still look (their latest lease deadline); while the last party of
--          generation 'a' runs the action: 'a', 'ad' -> the runner's lease deadline (server
--          ms), 'ar' -> the runner's id
-- KEYS[2]  waiters: sorted set, waiter id -> lease deadline (server ms): the parties of
--          generation 'g' that arrived and wait
-- KEYS[3]  broken generations: sorted set, generation -> when the record goes (server ms)
-- KEYS[4]  wake-up channel: '=id1,...' names the parties a trip released; '*' on a break

--@ helper bar_t NOW_US NOW
local bar_t = redis.call('time')
local NOW_US = tonumber(bar_t[1]) * 1000000 + tonumber(bar_t[2])
local NOW = math.floor(NOW_US / 1000)

--@ helper bar_next uses fmt NOW_US
-- The generation after `g`: strictly greater than every generation this name ever had, also
-- after the state was deleted at rest (floored by the server clock, in µs).
local function bar_next(g)
  if g and tonumber(g) >= NOW_US then
    return fmt(tonumber(g) + 1)
  end
  return fmt(NOW_US)
end

--@ helper bar_break uses fmt NOW
-- Out of memory (maxmemory under noeviction), Redis refuses a script's first write when that
-- command may use memory (HSET, ZADD may; DEL, HDEL, PEXPIREAT, PERSIST may not) and allows the
-- writes after it. What must work then (a renewal, a trip, a break: what ends or keeps a wait,
-- never what starts one) writes first with a command that may not: DEL, or outlive() from
-- _prelude.lua.

-- Break generation `g`: every party waiting in it raises BrokenBarrierError, and the barrier
-- stays broken, for good, until reset(). `keep` is how long the record of `g` stays, ms.
-- The DEL comes first: a break works out of memory too.
local function bar_break(g, keep)
  redis.call('del', KEYS[2])
  redis.call('hdel', KEYS[1], 'a', 'ad', 'ar')
  redis.call('hset', KEYS[1], 'b', '1')
  redis.call('persist', KEYS[1])
  if g then
    local until_ = fmt(NOW + tonumber(keep))
    redis.call('zadd', KEYS[3], until_, g)
    redis.call('pexpireat', KEYS[3], until_)
  end
  redis.call('publish', KEYS[4], '*')
end

--@ helper bar_trip uses fmt NOW bar_next
-- Trip generation `g`: release its waiting parties (named in one hint) and open the next one.
-- A released party that missed the hint learns at its next look that `g` tripped from the
-- state itself, which therefore stays until their leases run out ('k'), at rest too.
-- The DEL comes first: a trip works out of memory too.
local function bar_trip(g)
  local entries = redis.call('zrange', KEYS[2], 0, -1, 'withscores')
  redis.call('del', KEYS[2])
  redis.call('hdel', KEYS[1], 'a', 'ad', 'ar')
  local names = {}
  local k = tonumber(redis.call('hget', KEYS[1], 'k') or '0')
  for i = 1, #entries, 2 do
    names[#names + 1] = entries[i]
    k = math.max(k, tonumber(entries[i + 1]))
  end
  if k > NOW then
    redis.call('hset', KEYS[1], 'g', bar_next(g), 'k', fmt(k))
  else
    redis.call('hset', KEYS[1], 'g', bar_next(g))
  end
  if #names > 0 then
    if #names <= 200 then
      redis.call('publish', KEYS[4], '=' .. table.concat(names, ','))
    else
      redis.call('publish', KEYS[4], '*')  -- too many to name: each looks, and finds it tripped
    end
  end
end

--@ helper bar_reap uses NOW bar_break
-- A party whose lease ran out (its process died while waiting), or a runner that died in its
-- action, breaks the barrier. Return true when it did.
local function bar_reap(g, keep)
  local ad = redis.call('hget', KEYS[1], 'ad')
  if (ad and tonumber(ad) <= NOW)
      or #redis.call('zrangebyscore', KEYS[2], '-inf', NOW, 'limit', 0, 1) > 0 then
    bar_break(g, keep)
    return true
  end
  return false
end

--@ helper bar_settle uses fmt NOW
-- The state lives as long as what it records: for good while broken; while parties wait or an
-- action runs, as long as their leases; at rest (nothing waits, not broken) as long as the
-- parties released by the latest trip may look ('k'; the parties number is forgotten then),
-- and after that not at all.
local function bar_settle()
  local st = redis.call('hmget', KEYS[1], 'b', 'ad', 'k')
  if st[1] == '1' then
    redis.call('persist', KEYS[1])
    return
  end
  local last = 0
  local top = redis.call('zrange', KEYS[2], -1, -1, 'withscores')
  if top[2] then
    last = tonumber(top[2])
    redis.call('pexpireat', KEYS[2], top[2])
  end
  if st[2] and tonumber(st[2]) > last then
    last = tonumber(st[2])
  end
  local k = tonumber(st[3] or '0')
  if last == 0 then  -- at rest
    if k <= NOW then
      redis.call('del', KEYS[1])
      return
    end
    redis.call('hdel', KEYS[1], 'p')
  end
  redis.call('pexpireat', KEYS[1], fmt(math.max(last, k)))
end
