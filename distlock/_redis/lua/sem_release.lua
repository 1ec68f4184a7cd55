-- Give back n permits: the caller's own first (ARGV[4...]); for the rest, permits held
-- elsewhere, the one whose lease runs out first first (recorded as handed, so their owners
-- forget them quietly); when no permit is held anywhere, raise the count (extra). That is
-- threading's count, with every held permit still accounted for by a lease.
-- KEYS[1]  the semaphore (sorted set, see _sem.lua)
-- KEYS[2]  handed: sorted set, permit id -> its lease deadline, for permits released on their
--          owner's behalf
-- KEYS[3]  queue: sorted set of waiters (see sem_acquire); a hint is published while it exists
-- KEYS[4]  wake-up channel
-- KEYS[5...]  the keys of the kinds that may not share the name (wrong_kind, _prelude.lua);
--          a release of the caller's own permits only may leave them out
-- ARGV[1]  the value the caller's semaphore was constructed with
-- ARGV[2]  '1' for a bounded semaphore (the free count may not go above the value), else '0'
-- ARGV[3]  n, how many to release (>= 1)
-- ARGV[4...]  ids of permits the caller's process holds, at most n: given back first
-- return   the permits free afterwards (>= 0);
--          -1 when a bounded semaphore would go above its value (nothing changed);
--          -2 when the semaphore is in use with another value (nothing changed);
--          -3 when the count would go above 2^53 - 1, the largest Lua numbers and Redis
--          scores keep exactly (nothing changed);
--          -4 when there is no semaphore here (the release would make one) and KEYS[5...]
--          were not sent (nothing changed: send it again with them);
--          {free, id, ...} when some given ids were no longer held (their lease had run out, so
--          they had come back already): those ids; the rest of the release was done.
-- An id found among the handed ones was released on its owner's behalf before: releasing it
-- again counts as a release beyond the permits held, as it does in threading.
--@ uses fmt sem_now sem_live sem_settle sem_wake sem_sliced sem_scores sem_release_reply wrong_kind
local value = tonumber(ARGV[1])
-- The common release, release(1) of the caller's one permit while nothing else is held and the
-- count was never raised: the lowest three members are then the value and that permit, and
-- nothing else; one read tells (a +inf permit is live: the key is), and the key goes.
if #ARGV == 4 and ARGV[3] == '1' then
  local low = redis.call('zrange', KEYS[1], 0, 2, 'withscores')
  if #low == 4 and low[1] == '~v' and low[3] == ARGV[4] and -tonumber(low[2]) - 1 == value
      and sem_live(low[4]) then
    redis.call('del', KEYS[1])
    sem_wake(KEYS[3], KEYS[4], value)
    return value
  end
end
local _, NOW_S = sem_now()
-- One read for the counters and the deadlines of the caller's permits.
local scores = sem_scores(KEYS[1], ARGV, 4)
local recorded = scores[1] and -tonumber(scores[1]) - 1
local extra = scores[2] and -tonumber(scores[2]) - 1 or 0
if recorded and recorded ~= value then
  return -2
end
if not recorded then
  -- No semaphore here (every id given is lost). The release makes one (its count raised)
  -- when it releases more than the ids it names, or one of them was handed (released on its
  -- owner's behalf: releasing it again counts beyond the permits held); unless the name is
  -- another kind's (a name is one lock). A release of one's own permits sends no other
  -- kinds' keys (its usual path needs none): ask for them, having changed nothing.
  local creates = tonumber(ARGV[3]) > #ARGV - 3
  for i = 4, #ARGV do
    if creates then
      break
    end
    local score = redis.call('zscore', KEYS[2], ARGV[i])
    creates = score ~= false and tonumber(score) > (sem_now())
  end
  if creates then
    if not KEYS[5] then
      return -4
    end
    local wrong = wrong_kind('S', 'LWEB', 5)
    if wrong then
      return wrong
    end
  end
end
local live = 0
if recorded then
  live = redis.call('zcount', KEYS[1], '(' .. NOW_S, '+inf')
end
-- The caller's permits still held are counted (the common case: all of them, so no table is
-- built for them); the others were handed (released on the owner's behalf) or lost.
local n_mine, handed, lost = 0, nil, nil
for i = 4, #ARGV do
  local deadline = scores[i - 1]
  if deadline and sem_live(deadline) then
    n_mine = n_mine + 1
  else
    if deadline then
      redis.call('zrem', KEYS[1], ARGV[i])  -- expired: it came back already
    end
    if not handed then
      handed, lost = {}, {}
      redis.call('zremrangebyscore', KEYS[2], 0, NOW_S)
    end
    if redis.call('zscore', KEYS[2], ARGV[i]) then
      handed[#handed + 1] = ARGV[i]
    else
      lost[#lost + 1] = ARGV[i]
    end
  end
end
local rest = tonumber(ARGV[3]) - (#ARGV - 3) + (handed and #handed or 0)
local free = value + extra - live
local raised = n_mine + rest
if ARGV[2] == '1' and free + raised > value then
  return -1
end
-- Above 2^53 - 1 a double no longer holds every integer: a count raised further would lose
-- releases. (The sum itself may be inexact, but it is above the limit exactly when the true
-- one is, and when it is not it is exact.)
if free + raised > 9007199254740991 then
  return -3
end
live = live - n_mine
-- Taking the caller's permits out one by one is needless when the key goes anyway (at rest
-- afterwards: the common release of one's own permit is then one DEL).
if rest > 0 or live > 0 or extra > 0 then
  if handed then
    local mine = {}
    for i = 4, #ARGV do
      local deadline = scores[i - 1]
      if deadline and sem_live(deadline) then
        mine[#mine + 1] = ARGV[i]
      end
    end
    sem_sliced('zrem', KEYS[1], mine, 1000)
  else
    sem_sliced('zrem', KEYS[1], ARGV, 1000, 4)
  end
end
if handed then
  sem_sliced('zrem', KEYS[2], handed, 1000)
end
if rest > 0 then
  -- permits are handed over, or the count raised (the key loses its TTL): a +inf permit gets
  -- its deadline first (until here it counted as live: its key exists)
  sem_settle()
  local others = {}
  if live > 0 then
    others = redis.call('zrangebyscore', KEYS[1], '(' .. NOW_S, '+inf', 'withscores',
                        'limit', 0, rest)
  end
  local ids, entries = {}, {}
  for i = 1, #others, 2 do
    ids[#ids + 1] = others[i]
    entries[#entries + 1] = others[i + 1]
    entries[#entries + 1] = others[i]
  end
  if #ids > 0 then
    sem_sliced('zrem', KEYS[1], ids, 1000)
    sem_sliced('zadd', KEYS[2], entries, 2000)
    local top = redis.call('zrange', KEYS[2], -1, -1, 'withscores')
    redis.call('pexpireat', KEYS[2], top[2])
    live = live - #ids
  end
  if rest > #ids then
    extra = extra + rest - #ids
    redis.call('zadd', KEYS[1], fmt(-(value + 1)), '~v', fmt(-(extra + 1)), '~x')
    redis.call('persist', KEYS[1])
  end
end
if live == 0 and extra == 0 then
  redis.call('del', KEYS[1])  -- at rest (expired permits left by dead holders go too)
end
free = free + raised
sem_wake(KEYS[3], KEYS[4], free)
return sem_release_reply(free, lost)
