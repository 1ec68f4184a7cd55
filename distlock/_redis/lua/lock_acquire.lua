-- Acquire, or re-enter, an exclusive owner-counted hold (DistLock, DistRLock).
-- KEYS[1]  lock hash: owner -> count, ':t' -> fencing token, ':i' -> holder info,
--          ':l' -> every lease this hold was given, in all (ms): its age is ':l' - PTTL,
--          ':w' -> present when processes may be waiting (the release then wakes one),
--          ':s' -> since when a queued process has waited for this hold (server ms),
--          ':r' -> alone, with ':w' (no owner, no ':t'): the lock is kept for the process of
--          that wake-up channel, for a moment (free_hold): only its waiters' tries take it
-- KEYS[2]  fence: last token granted for this name
-- KEYS[3]  registry of waiting processes: sorted set, wake-up channel -> entry deadline (ms)
-- KEYS[4]  optional: the fair queue's deadlines (see _fair.lua): a free lock with live fair
--          waiters is theirs first, so a plain try is refused
-- KEYS[5..11]  the keys of the kinds that may not share the name (wrong_kind, _prelude.lua)
-- KEYS[12], KEYS[13]  optional: the writer hash and the readers of the read/write lock of the
--          same name (rw_held): while either holds it, a try is refused as if the lock were
--          held, and a queued waiter's registers its process, which their release wakes
-- ARGV[1]  owner id
-- ARGV[2]  lease, ms
-- ARGV[3]  fence TTL, ms: the lease plus the fence retention (see next_token); a re-entry
--          that extends the hold extends the counter to at least this (lengthen_hold)
-- ARGV[4]  holder info (host:pid), kept for `distlock status`
-- ARGV[5]  mode: absent or '' for a first try; 'w' for a try by a queued waiter; 'p' for a
--          queued waiter's try that, when it fails, neither registers the process nor flags the
--          hold (a waiter backing off after it lost a race: no release wakes it meanwhile);
--          otherwise the token of the hold the caller believes it has (re-entry)
-- ARGV[6]  count to add; absent means 1 (the saved count for _acquire_restore())
-- ARGV[7]  modes 'w'/'p' only: the waiter's process channel, to register when the try fails
-- ARGV[8]  modes 'w'/'p' only: registry entry lease, ms
-- ARGV[9]  modes 'w'/'p' only: '1' when other threads of the process still wait after a grant
-- ARGV[10] modes 'w'/'p' only, optional: the waiter's ident. A refused try then leaves the
--          process' hand-off record in the hash, ':h' .. ARGV[7] -> '<ident> <owner> <lease>
--          <fence TTL> <count> <others> <registry lease> <holder info>', the lease the shorter
--          of ARGV[2] and ARGV[8]: a release that yields to the process hands the lock to that
--          waiter (free_hold). The record ends with the hold it was left in.
-- return   token (> 0) when granted or re-entered; in modes 'w'/'p' also when the hold is the
--          caller's already (handed to it by a release of its process whose reply was lost:
--          lock_release, ARGV[5]), its lease then lengthened to ARGV[2];
--          0 when the re-entered hold is gone or is someone else's (the caller's lease is lost);
--          -(pttl + 1) (<= -1) when someone else holds it, pttl its remaining lease in ms
--          (0 when unknown); the hold is then flagged so that its release wakes a waiter;
--          0 in modes 'w'/'p', -2 otherwise, when the lock is free but fair waiters queue for
--          it: the caller's wait goes on in the fair queue (mixed modes: docs/guides/locks.rst).
--@ uses next_token lengthen_hold held_reply register_waiter fmt now_ms wrong_kind rw_held
-- Numbers go to Redis as the strings they came in (ARGV) where they can: each conversion of a
-- Lua number to a command argument, or of a string to a number, costs the server a formatting
-- or parsing pass, a measurable share of an uncontended grant.
local mode = ARGV[5] or ''
local count = ARGV[6] or '1'
if mode ~= '' and mode ~= 'w' and mode ~= 'p' then
  local lease = tonumber(ARGV[2])
  if redis.call('hget', KEYS[1], ':t') ~= mode or redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
    return 0
  end
  redis.call('hincrby', KEYS[1], ARGV[1], tonumber(count))
  local pttl = redis.call('pttl', KEYS[1])
  if pttl < lease then
    -- the hold lives longer: so must the counter, as after a renewal (unextended, the hold
    -- is still within what its grant or last renewal gave the counter)
    lengthen_hold(KEYS[1], KEYS[2], pttl, lease, ARGV[3])
  end
  return tonumber(mode)
end
-- One EXISTS answers the uncontended case: neither a hold nor anyone registered as waiting,
-- nor the name in use as another kind (KEYS[5...]: a name is one lock). Otherwise the kinds
-- are looked at first, then PTTL tells whether the lock is held (-2: no such key) and, if so,
-- for how long.
local present
if KEYS[5] then
  present = redis.call('exists', KEYS[1], KEYS[3], KEYS[4], unpack(KEYS, 5))
elseif KEYS[4] then
  present = redis.call('exists', KEYS[1], KEYS[3], KEYS[4])
else
  present = redis.call('exists', KEYS[1], KEYS[3])
end
local kept = false  -- the lock was kept for the caller's process (free_hold)
if present > 0 then
  -- The rare keys, the other kinds' and the read/write lock's (KEYS[5...]): a contended try
  -- seldom finds any, and then skips both looks at them (each redis.call costs a script about
  -- as much as a small command).
  local rare = KEYS[5] and redis.call('exists', unpack(KEYS, 5)) > 0
  if rare then
    local wrong = wrong_kind('L', 'SEB', 5)
    if wrong then
      return wrong
    end
  end
  local pttl = redis.call('pttl', KEYS[1])
  if pttl ~= -2 then
    if mode == 'w' or mode == 'p' then
      local h = redis.call('hmget', KEYS[1], ':t', ':r', ':s', ARGV[1])
      if h[1] and h[4] then
        -- the lock was handed to this waiter (lock_release, in-process hand-off) and it was
        -- not told (the release's reply was lost): it is its own, with the lease it asks for
        if pttl < tonumber(ARGV[2]) then
          lengthen_hold(KEYS[1], KEYS[2], pttl, tonumber(ARGV[2]), ARGV[3])
        end
        if ARGV[9] == '1' then
          local since = register_waiter(KEYS[3], ARGV[7], tonumber(ARGV[8]))
          redis.call('hset', KEYS[1], ':w', 1, ':s', since)
        else
          redis.call('zrem', KEYS[3], ARGV[7])
        end
        return tonumber(h[1])
      end
      if h[1] or h[2] ~= ARGV[7] then
        -- held, or kept for another process
        if mode == 'w' then
          -- ':s', since when a queued process has waited for this hold. The first to
          -- register (no registry yet: present == 1) starts it afresh, as every earlier
          -- waiter has left; later ones keep it.
          local since = register_waiter(KEYS[3], ARGV[7], tonumber(ARGV[8]))
          if present > 1 and h[3] then
            redis.call('hset', KEYS[1], ':w', 1)
          else
            redis.call('hset', KEYS[1], ':w', 1, ':s', since)
          end
        end
        if ARGV[10] then
          -- the hand-off record: a release that yields to this process hands the lock
          -- straight to this waiter (free_hold), for the shorter of its lease and its
          -- process' registry entry. A 'p' try writes it too: the waiter woken when another
          -- of its process left (pubsub.Board.leave) puts its own in place of the leaver's.
          local span = ARGV[2]
          if tonumber(ARGV[8]) < tonumber(span) then
            span = ARGV[8]
          end
          redis.call('hset', KEYS[1], ':h' .. ARGV[7], ARGV[10] .. ' ' .. ARGV[1] .. ' ' .. span
                     .. ' ' .. ARGV[3] .. ' ' .. count .. ' ' .. ARGV[9] .. ' ' .. ARGV[8]
                     .. ' ' .. ARGV[4])
        end
        return held_reply(KEYS[1], pttl)
      end
      kept = true
    else
      redis.call('hset', KEYS[1], ':w', 1)
      return held_reply(KEYS[1], pttl)
    end
  else
    local busy = rare and KEYS[12] and rw_held(KEYS[12], KEYS[13])
    if busy then
      -- the read/write lock of this name is held: a name is one lock
      if mode == 'w' then
        register_waiter(KEYS[3], ARGV[7], tonumber(ARGV[8]))
      end
      return held_reply(KEYS[1], busy)
    end
    if KEYS[4] and redis.call('exists', KEYS[4]) == 1
        and redis.call('zcount', KEYS[4], now_ms(), '+inf') > 0 then
      if mode == 'w' or mode == 'p' then
        return 0
      end
      return -2
    end
  end
end
local token = next_token(KEYS[2], ARGV[3])
if present > 0 then
  -- processes are registered as waiting: this hold's release must wake the next of them
  redis.call('hset', KEYS[1], ARGV[1], count, ':t', fmt(token), ':i', ARGV[4], ':l', ARGV[2],
             ':w', '1')
else
  redis.call('hset', KEYS[1], ARGV[1], count, ':t', fmt(token), ':i', ARGV[4], ':l', ARGV[2])
end
if kept then
  -- the lock was kept for this process (free_hold): the hold is its now
  redis.call('hdel', KEYS[1], ':r', ':s')
end
if mode == 'w' or mode == 'p' then
  if ARGV[9] == '1' then
    local since = register_waiter(KEYS[3], ARGV[7], tonumber(ARGV[8]))
    redis.call('hset', KEYS[1], ':w', 1, ':s', since)
  else
    redis.call('zrem', KEYS[3], ARGV[7])
  end
end
redis.call('pexpire', KEYS[1], ARGV[2])
return token
