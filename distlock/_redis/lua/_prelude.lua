-- Shared by every script: each script gets the helpers it uses (see distlock/_scripts.py) in
-- front of it when the scripts are loaded, so that it stays one EVALSHA and one round trip.

--@ helper fmt
-- fmt(x): a whole number (|x| < 2^53, as every caller passes) as Redis should get it: Lua's
-- default format would write a large one with an exponent. C's '%d' is half the cost of '%.0f'
-- but formats a C long, which may be 32 bits: larger numbers go in two parts of 9 digits or
-- fewer each.
local function fmt(x)
  if x > -1000000000 and 1000000000 > x then
    return string.format('%d', x)
  end
  local sign = ''
  if x < 0 then
    sign, x = '-', -x
  end
  local high = math.floor(x / 1000000000)
  return string.format('%s%d%09d', sign, high, x - high * 1000000000)
end

--@ helper outlive uses fmt
-- outlive(key, until_, now): make `key` live at least until `until_` (server ms; `now` is the
-- server's time, ms); a key without a TTL keeps none. Out of memory (maxmemory under
-- noeviction), Redis refuses a script's first write when that command may use memory (ZADD,
-- HSET may; PEXPIREAT and PERSIST may not) and allows the writes after it: a renewal that calls
-- this before its ZADD or HSET works out of memory too.
local function outlive(key, until_, now)
  local pttl = redis.call('pttl', key)
  if pttl >= 0 then
    redis.call('pexpireat', key, fmt(now + math.max(pttl, until_ - now)))
  else
    redis.call('persist', key)
  end
end

--@ helper next_token uses fmt
-- next_token(fence_key): the next fencing token of a name, strictly greater than every
-- token granted before, also after a restart of a server that kept nothing, and after a
-- failover to a replica that had not seen the last grants.
-- The token is max(the last token + 1, the server's clock in microseconds (TIME)): one TIME and
-- one SET ... GET per grant, which writes the clock and returns the last token (a second SET
-- in the rare case that the last token is not below the clock). The counter alone would be
-- strictly increasing on one server. The floor covers a counter that went back: a fresh one
-- (the name's first grant, or a server that lost its data) would start at 1, and a promoted
-- replica's may lag the old master's by the grants it did not receive. Every earlier token is
-- at most the clock reading of its own grant (or one more than an earlier token, on a server
-- whose clock went back or within a microsecond), so the new token is larger as long as this
-- server's clock is ahead of the clock that granted the earlier ones: grants (script runs, one
-- at a time) take well over a microsecond each, and hosts' clocks differ by less than a
-- failover takes (see docs/safety.rst).
-- Tokens stay below 2^53, exact in Lua's doubles; the clock is stored with fmt (above).
-- The token doubles as the grant time that distlock top shows: it is this server's clock at
-- the grant (µs) but for the rare cases above, so a hold's age is the server's TIME minus the
-- token (a read hold's token is in its member: its age costs no field at all).
-- The counter lives `ttl` ms from this grant: the grant's lease plus the fence retention, so
-- that it outlives the hold by the retention (renewals extend it alike) and then goes.
-- (Each redis.call costs a script about as much as a small command: an INCR, then TIME, then
-- SET or PEXPIRE would be one call more per grant.)
local function next_token(fence_key, ttl)
  local now = redis.call('time')
  local token = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local last = tonumber(redis.call('set', fence_key, fmt(token), 'px', ttl, 'get') or 0)
  if last >= token then
    token = last + 1
    redis.call('set', fence_key, fmt(token), 'px', ttl)
  end
  return token
end

--@ helper outlive_fence
-- outlive_fence(fence_key, ttl): a renewal's share, and that of a re-entry that extends its
-- hold: the counter lives at least `ttl` ms more.
local function outlive_fence(fence_key, ttl)
  if redis.call('pttl', fence_key) < tonumber(ttl) then
    redis.call('pexpire', fence_key, ttl)
  end
end

--@ helper lengthen_hold uses outlive_fence
-- lengthen_hold(hash, fence_key, pttl, lease, fence_ttl): a re-entry of an exclusive hold
-- (its hash has `pttl` ms left) that asks for a longer `lease`: the hash lives that long, the
-- fence counter outlives it as after a renewal, and the hold's age record (':l', every lease
-- given in all: age = ':l' - PTTL) grows by what was added.
local function lengthen_hold(hash, fence_key, pttl, lease, fence_ttl)
  redis.call('pexpire', hash, lease)
  outlive_fence(fence_key, fence_ttl)
  if pttl >= 0 then
    redis.call('hincrby', hash, ':l', lease - pttl)
  end
end

--@ helper held_reply
-- held_reply(key, pttl): the reply "someone else holds it": -(pttl + 1), where pttl is the
-- holder's remaining lease in ms (read here unless the caller already has it), 0 when unknown
-- (no expiry). Always <= -1. A lease about to run out (PTTL 0: under 1 ms left) is reported
-- as 1 ms, not as unknown, so that its waiter tries again at once instead of sleeping the
-- whole wait cap.
local function held_reply(key, known_pttl)
  local pttl = known_pttl or redis.call('pttl', key)
  if pttl < 0 then pttl = 0 elseif pttl == 0 then pttl = 1 end
  return -(pttl + 1)
end

--@ helper now_ms
-- The registry of waiting processes of an exclusive lock: a sorted set whose members are the
-- wake-up channels of the processes that have threads waiting (one channel per process and
-- lock, named by the client), scored by the entry's deadline on the server clock (ms). A
-- release wakes exactly one waiting process, not every subscriber; entries of processes that
-- died expire by their deadline.

local function now_ms()
  local t = redis.call('time')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

--@ helper register_waiter uses now_ms
-- register_waiter(queue, channel, ms): (re)enter a process' channel, at the back, for ms.
-- Every process' entry gets the same lease, so the newest one ends last; the registry lives at
-- least ms more (never less: a read/write lock's entry, rw_enlist, may end later).
-- Returns the server's time (ms), which the caller records as the hold's waiting-since (':s').
local function register_waiter(queue, channel, ms)
  local now = now_ms()
  redis.call('zadd', queue, now + ms, channel)
  if redis.call('pttl', queue) < ms then
    redis.call('pexpire', queue, ms)
  end
  return now
end

--@ helper pop_waiter uses now_ms
-- pop_waiter(queue): take the longest-registered live waiting process off the registry (the
-- dead ones, past their deadline, go first); its wake-up channel, or nil when none is left.
local function pop_waiter(queue)
  redis.call('zremrangebyscore', queue, '-inf', now_ms())
  return redis.call('zpopmin', queue)[1]
end

--@ helper rw_hint
-- rw_hint(channel): does a lock's registry entry (below) name a read/write lock's waiters of
-- the same name rather than a process? Those are registered by rw_enlist, with the read/write
-- lock's own channel (its name ends in ':wake', a process' channel in its session id): hint
-- them there ('*': every waiting reader; '1': a writer per process) and answer true.
local function rw_hint(channel)
  if string.sub(channel, -5) ~= ':wake' then
    return false
  end
  if string.sub(channel, -8) == ':rw:wake' then
    redis.call('publish', channel, '*')
  else
    redis.call('publish', channel, '1')
  end
  return true
end

--@ helper pop_process uses pop_waiter rw_hint
-- pop_process(queue): pop_waiter, hinting the read/write lock's waiters registered ahead on
-- the way (rw_hint): they take no process' turn, since they may have stopped waiting. The
-- first process' channel, or nil; and whether anyone at all was hinted.
local function pop_process(queue)
  local first = pop_waiter(queue)
  local hinted = false
  while first and rw_hint(first) do
    hinted = true
    first = redis.call('zpopmin', queue)[1]
  end
  return first, hinted
end

--@ helper wake_one uses pop_process
-- wake_one(queue): hint the longest-registered live waiting process, and take it off the
-- registry (its waiter registers again if it loses the race for the lock); the read/write
-- lock's waiters registered ahead of it are hinted too (pop_process). 1 if a process was.
local function wake_one(queue)
  local first = pop_process(queue)
  if first then
    redis.call('publish', first, '1')
    return 1
  end
  return 0
end

--@ helper rw_enlist uses register_waiter
-- rw_enlist(hash, queue, channel, pttl, bound): a try of the read/write lock of the same name
-- was refused by this lock: its hash has `pttl` ms left, or (-2, no hash) processes wait for
-- it. Flag the hold, if any, as waited on (':w') and register the read/write lock's channel in
-- the lock's registry of waiting processes, for a second longer than the refusal's `bound`
-- (ms: the hold's PTTL, or the first waiting process' entry's), so that the release that frees
-- the lock, or the waiting process that leaves, hints it (rw_hint). A name is one lock
-- (docs/guides/kinds.rst).
local function rw_enlist(hash, queue, channel, pttl, bound)
  register_waiter(queue, channel, math.max(bound, 0) + 1000)
  if pttl ~= -2 then
    redis.call('hset', hash, ':w', 1)
  end
end

--@ helper lock_waited uses fmt
-- lock_waited(queue, now): ms until the first live entry of a process waiting for the lock
-- (its registry `queue`; not the read/write lock's own entries, rw_hint) runs out; nil when no
-- process waits. New readers wait behind it, as behind a waiting writer (writer preference).
local function lock_waited(queue, now)
  local live = redis.call('zrangebyscore', queue, '(' .. fmt(now), '+inf', 'withscores')
  for i = 1, #live, 2 do
    if string.sub(live[i], -5) ~= ':wake' then
      return math.max(1, tonumber(live[i + 1]) - now)
    end
  end
  return nil
end

--@ helper rw_held uses now_ms fmt
-- rw_held(writer, readers): a lock's try looks at the read/write lock of the same name: nil
-- when no writer and no live reader holds it; else how long it may still be held (ms, for
-- held_reply): the writer's PTTL, or until the earliest live reader's lease runs out.
local function rw_held(writer, readers)
  local pttl = redis.call('pttl', writer)
  if pttl ~= -2 then
    return pttl
  end
  local now = now_ms()
  local first = redis.call('zrangebyscore', readers, '(' .. fmt(now), '+inf', 'withscores',
                           'limit', 0, 1)
  if #first > 0 then
    return math.max(1, tonumber(first[2]) - now)
  end
  return nil
end

--@ helper free_hold uses pop_process wake_one next_token register_waiter fmt
-- free_hold(hash, queue, waited, how, fence): a plain hold of an exclusive lock ends (its last
-- release, a condition's wait, an undone try): free it, and when it was waited on (`waited`,
-- its ':w'), wake the longest-registered waiting process. `how` (distlock/_core/shares.py): 'k',
-- the releasing process is in its quantum: wake nobody (it takes the lock again, or nudges
-- the next waiter soon: lock_nudge); 'y', it yields: that process also gets the lock.
-- When that process left a hand-off record in the hash (':h' .. its channel, written by its
-- waiter's refused try: lock_acquire) and `fence` is given, the lock is handed straight to
-- that waiter: a hold with a new token, the record's owner and its short lease, and a
-- '+<ident> <token> <lease> <turns>' message that names the waiter (the direct hand-off:
-- it returns without a try of its own). Otherwise the lock is kept for that process for a
-- moment: the hash is left with only ':r' (its wake-up channel) and ':w', for 250 ms. Any of
-- its waiters takes it (lock_acquire); every other try is refused meanwhile, as if it were
-- held. A process that no longer waits gives it up at once (lock_unwait); one that died,
-- within the 250 ms. The read/write lock's waiters registered ahead are hinted, and the lock is
-- not kept for them (pop_process). Its hint, 'y<n>', tells it how many processes take turns
-- (those still registered, itself and the one yielding): its quantum is barge_limit / n.
local function free_hold(hash, queue, waited, how, fence)
  local yields = waited and how == 'y'
  local first = yields and pop_process(queue)
  local record = first and fence and redis.call('hget', hash, ':h' .. first)  -- before the del
  redis.call('del', hash)
  if not waited or how == 'k' then
    return
  end
  if not yields then
    wake_one(queue)
    return
  end
  if not first then
    return
  end
  local turns = tostring(redis.call('zcard', queue) + 2)
  if record then
    -- ident owner lease fence-ttl count others registry-lease info (lock_acquire)
    local ident, owner, lease, fttl, count, others, reg, info =
      string.match(record, '^(%S+) (%S+) (%S+) (%S+) (%S+) (%S+) (%S+) (.*)$')
    if ident then
      local token = fmt(next_token(fence, fttl))
      redis.call('hset', hash, owner, count, ':t', token, ':i', info, ':l', lease, ':w', 1)
      redis.call('pexpire', hash, lease)
      if others == '1' then
        register_waiter(queue, first, tonumber(reg))
      end
      redis.call('publish', first, '+' .. ident .. ' ' .. token .. ' ' .. lease .. ' ' .. turns)
      return
    end
  end
  redis.call('hset', hash, ':r', first, ':w', 1)
  redis.call('pexpire', hash, 250)
  redis.call('publish', first, 'y' .. turns)
end

--@ helper wrong_kind
-- wrong_kind(this, others, first): nil when the name may be used as kind `this`; else the
-- error reply that refuses it, 'DISTLOCK_WRONGKIND <found> <this>', sent before anything is
-- written. A name is one lock (docs/guides/kinds.rst): it has a kind while it is held or
-- waited on, or keeps state at rest (a set event, a broken barrier). `others` are the kinds
-- that cannot share a name with `this`, one letter each: L a lock (DistLock, DistRLock,
-- DistCondition), W a read/write lock, S a semaphore, E an event, B a barrier; KEYS[first]
-- on are their keys, kind after kind, COUNT of each (distlock/_core/keys.py, other_kinds):
-- the name's own, so in the same cluster slot. (The fence counter, every kind's, gives no
-- kind.) One EXISTS answers the usual case; only a refusal looks which kind it is. A caller
-- that sends no such keys (one from before the check) is not checked.
local function wrong_kind(this, others, first)
  if not KEYS[first] then
    return nil
  end
  local COUNT = {L = 4, W = 3, S = 2, E = 3, B = 2}
  local last = first - 1
  for i = 1, #others do
    last = last + COUNT[string.sub(others, i, i)]
  end
  if redis.call('exists', unpack(KEYS, first, last)) == 0 then
    return nil
  end
  for i = 1, #others do
    local kind = string.sub(others, i, i)
    local n = COUNT[kind]
    if redis.call('exists', unpack(KEYS, first, first + n - 1)) > 0 then
      return redis.error_reply('DISTLOCK_WRONGKIND ' .. kind .. ' ' .. this)
    end
    first = first + n
  end
end
