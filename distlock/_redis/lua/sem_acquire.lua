-- Take one permit of a semaphore when one is free; a waiter queues itself while none is.
-- KEYS[1]  the semaphore (sorted set, see _sem.lua)
-- KEYS[2]  queue: sorted set, waiter id -> entry deadline (server ms); releases publish a hint
--          while it exists
-- KEYS[3]  wake-up channel: '<n>' wakes up to n waiters per process
-- KEYS[4...]  the keys of the kinds that may not share the name (wrong_kind, _prelude.lua)
-- ARGV[1]  permit id, '<session>:<thread>:<n>@<ms>': the acquiring host's clock at this try
--          (the grant time distlock top shows; a waiter sends each try under a new one); the
--          waiter's id in the queue is the id without '@<ms>' (an id without one is its own)
-- ARGV[2]  lease of the permit, ms
-- ARGV[3]  the value the caller's semaphore was constructed with
-- ARGV[4]  absent for a try that does not queue (a first try); '0' for a waiter's last try
--          (it leaves the queue whatever happens); else the waiter's entry lease, ms (it joins,
--          or stays in, the queue when refused)
-- return   n + 1 (>= 1) when granted, n the permits still free;
--          0 when the semaphore is in use with another value (nothing changed);
--          -(bound + 1) (<= -1) when none is free, bound the ms until the first held permit's
--          lease runs out (0 when none is held).
-- Expired permits (a holder that died) are removed first; when that frees more than this try
-- takes, the waiters are told.
--@ uses fmt sem_now sem_settle sem_counters sem_prune sem_wake wrong_kind
local wrong = wrong_kind('S', 'LWEB', 4)  -- a name is one lock
if wrong then
  return wrong
end
local value = tonumber(ARGV[3])
local lease = tonumber(ARGV[2])
local queue = ARGV[4]
local waiter = queue and (string.match(ARGV[1], '^(.*)@%d+$') or ARGV[1])
-- The permit goes in first, scored +inf, with the value when none is recorded: every existing
-- semaphore key holds '~v', so adding both means it was at rest, where a permit is always free
-- (value >= 1; value 0 is refused below as any full semaphore is). That is the uncontended
-- path: two commands, and the key's TTL is the permit's lease (see _sem.lua). Otherwise the
-- permit went in as a placeholder: it gets its deadline when granted, and goes when refused.
-- Out of memory, Redis refuses this ZADD (a first write that may use memory); the try goes on
-- without a placeholder, and its later writes are allowed once one that uses none ran (the
-- prune, or sem_settle's TTL), so that a refused try and a waiter's look still work.
local added = 0
if value > 0 then
  added = redis.pcall('zadd', KEYS[1], 'nx', '+inf', ARGV[1], fmt(-(value + 1)), '~v')
  if type(added) == 'table' then  -- an error reply: out of memory
    if not tostring(added.err):find('OOM') then
      return redis.error_reply(added.err)
    end
    added = 0
  end
end
if added == 2 then
  redis.call('pexpire', KEYS[1], ARGV[2])
  if queue then
    redis.call('zrem', KEYS[2], waiter)
  end
  return value
end
local NOW = sem_now()
local recorded, extra, counters = sem_counters()
if recorded and recorded ~= value then
  if added == 1 then
    redis.call('zrem', KEYS[1], ARGV[1])
  end
  return 0
end
local pruned, free = 0, value
if recorded then  -- (at rest the key does not exist: nothing to prune or count)
  sem_settle(ARGV[1])
  pruned = sem_prune()
  -- the permits held, not counting this try's own when it went in already
  free = value + extra - (redis.call('zcard', KEYS[1]) - counters - added)
end
if free > 0 then
  local until_ = fmt(NOW + lease)
  redis.call('zadd', KEYS[1], until_, ARGV[1])
  -- extra 0: the key lives at least as long as this lease; otherwise it has no TTL at all
  if extra == 0 and redis.call('pttl', KEYS[1]) < lease then
    redis.call('pexpireat', KEYS[1], until_)
  end
  if queue then
    redis.call('zrem', KEYS[2], waiter)
  end
  if pruned > 0 then
    sem_wake(KEYS[2], KEYS[3], free - 1)
  end
  return free
end
if added == 1 then
  redis.call('zrem', KEYS[1], ARGV[1])
end
if queue == '0' then
  redis.call('zrem', KEYS[2], waiter)
elseif queue then
  local entry_ms = tonumber(queue)
  local entry_until = fmt(NOW + entry_ms)
  redis.call('zadd', KEYS[2], entry_until, waiter)
  if redis.call('pttl', KEYS[2]) < entry_ms then
    redis.call('pexpireat', KEYS[2], entry_until)
  end
end
local first = redis.call('zrangebyscore', KEYS[1], 0, '+inf', 'withscores', 'limit', 0, 1)
if first[2] then
  -- (a +inf permit left here can only be this try's own, granted before and asked again: the
  -- key's TTL is its bound)
  local left = first[2] == 'inf' and redis.call('pttl', KEYS[1]) or tonumber(first[2]) - NOW
  return -(math.max(1, left) + 1)
end
if extra == 0 and recorded then
  redis.call('del', KEYS[1])  -- only expired permits were left: now at rest
end
return -1
