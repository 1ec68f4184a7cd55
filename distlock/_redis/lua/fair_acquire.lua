-- One try of a fair lock's wait (DistLock / DistRLock with fair=True): take it, or find it was
-- handed to this wait, or queue (or stay queued) for it. See _fair.lua for the queue's keys.
-- KEYS[1]  lock hash (as lock_acquire's, plus ':n': the nonce of the wait it was granted to)
-- KEYS[2]  fence: last token granted for this name
-- KEYS[3]  fq: nonce -> arrival (server µs)
-- KEYS[4]  fd: nonce -> entry deadline (server ms)
-- KEYS[5]  fe: nonce -> '<count>|<lease ms>|<owner>|<host:pid>|<process channel>'
-- KEYS[6]  the plain lock's registry of waiting processes (see lock_acquire): a queued waiter
--          registers its process there too, so that a release by any other path (a plain
--          holder's lock_release, a condition's wait) wakes a process that settles the queue
-- KEYS[7..13]  the keys of the kinds that may not share the name (wrong_kind, _prelude.lua)
-- KEYS[14], KEYS[15]  optional: the writer hash and the readers of the read/write lock of the
--          same name (rw_held): while either holds it, the lock is not free
-- ARGV[1]  owner id
-- ARGV[2]  lease, ms
-- ARGV[3]  fence retention, ms (a grant's fence TTL is its lease plus this)
-- ARGV[4]  holder info (host:pid)
-- ARGV[5]  the wait's nonce
-- ARGV[6]  count to take (1; a saved count for _acquire_restore())
-- ARGV[7]  the waiter's process channel (hand-off messages: '+<nonce> <token> <lease ms>')
-- ARGV[8]  queue entry lease, ms
-- ARGV[9]  'w': when refused, queue (arrival kept if already queued) and push the entry's
--          deadline on; 'n': when refused, leave the queue (a first try; the try at the deadline)
-- ARGV[10] optional: this try's number in its wait; a 'w' try that is refused keeps it with the
--          entry ('#' .. nonce in fe), and a hand-off names it ('+<nonce>/<number> ...')
-- return   token (> 0) when the caller holds it: granted now, or handed to this wait before
--          (its lease is then made the caller's full lease); -(pttl + 1) when refused (pttl:
--          the holder's remaining lease, ms).
--@ uses fair_now fair_drop fair_hand_off next_token fmt held_reply register_waiter wrong_kind rw_held
local wrong = wrong_kind('L', 'SEB', 7)  -- a name is one lock
if wrong then
  return wrong
end
local hand = redis.call('hmget', KEYS[1], ':n', ':t')
if hand[1] == ARGV[5] then
  -- handed to this wait (the message was missed or is on its way): the caller is alive, so
  -- the hold gets its full lease
  local left = redis.call('pttl', KEYS[1])
  redis.call('pexpire', KEYS[1], ARGV[2])
  if left >= 0 then
    redis.call('hincrby', KEYS[1], ':l', tonumber(ARGV[2]) - left)  -- age stays ':l' - PTTL
  end
  local fence_ttl = tonumber(ARGV[2]) + tonumber(ARGV[3])
  if redis.call('pttl', KEYS[2]) < fence_ttl then
    redis.call('pexpire', KEYS[2], fence_ttl)
  end
  return tonumber(hand[2])
end
local busy = nil  -- how long the read/write lock of this name may still be held, if it is
if not hand[2] and KEYS[14] then
  busy = rw_held(KEYS[14], KEYS[15])
end
if not hand[2] and not busy then
  -- free: the first live waiter goes first (perhaps the caller); nobody queued: the caller
  -- (the uncontended path, which reads no clock)
  local got = -1
  if redis.call('exists', KEYS[3]) == 1 then
    got = fair_hand_off(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], (fair_now()),
                        tonumber(ARGV[3]), ARGV[5], ARGV[2])
  end
  if got > 0 then
    return got
  end
  if got < 0 then
    -- (the caller's own entry, if it had one, was dead and is gone with the rest)
    local token = next_token(KEYS[2], tonumber(ARGV[2]) + tonumber(ARGV[3]))
    redis.call('hset', KEYS[1], ARGV[1], ARGV[6], ':t', fmt(token), ':i', ARGV[4], ':l', ARGV[2],
               ':n', ARGV[5])
    if redis.call('exists', KEYS[6]) == 1 then
      redis.call('hset', KEYS[1], ':w', 1)
    end
    redis.call('pexpire', KEYS[1], ARGV[2])
    return token
  end
end
if ARGV[9] == 'w' then
  local now, now_us = fair_now()
  local lease = tonumber(ARGV[8])
  local deadline = now + lease
  redis.call('zadd', KEYS[3], 'NX', fmt(now_us), ARGV[5])
  redis.call('zadd', KEYS[4], fmt(deadline), ARGV[5])
  redis.call('hset', KEYS[5], ARGV[5],
             ARGV[6] .. '|' .. ARGV[2] .. '|' .. ARGV[1] .. '|' .. ARGV[4] .. '|' .. ARGV[7])
  if ARGV[10] then
    redis.call('hset', KEYS[5], '#' .. ARGV[5], ARGV[10])
  end
  for i = 3, 5 do  -- each lives at least as long as the latest deadline in it
    if redis.call('pttl', KEYS[i]) < lease then
      redis.call('pexpire', KEYS[i], lease)
    end
  end
  register_waiter(KEYS[6], ARGV[7], lease)
  if not busy then
    redis.call('hset', KEYS[1], ':w', 1)
  end  -- (else the read/write lock's release wakes the registered process)
else
  fair_drop(KEYS[3], KEYS[4], KEYS[5], ARGV[5])
end
return held_reply(KEYS[1], busy)
