-- Helpers of the fair_* scripts (DistLock / DistRLock with fair=True). A fair lock keeps the
-- plain lock's hash (KEYS[1]: owner -> count, ':t', ':i', ':l', ':w'), plus ':n': the nonce of
-- the wait the hold was granted to. Its waiters queue in three keys, one entry per wait, named
-- by the wait's nonce ('<session id>:<random hex>'):
--   fq  sorted set: nonce -> arrival (server µs): the order, first come, first served;
--   fd  sorted set: nonce -> the entry's deadline (server ms), pushed on by every try of the
--       waiter; an entry past it is dead (its process died or stopped trying) and is dropped;
--   fe  hash: nonce -> '<count>|<lease ms>|<owner>|<host:pid>|<process channel>': what a
--       hand-off needs to write the hold for the waiter and tell its process; and, for a
--       waiter that numbers its tries, '#' .. nonce -> the number of the try that last pushed
--       the entry's deadline on, which its hand-off message names (the waiter believes the
--       hold from that try's send time).
-- Every key lives at least as long as the latest deadline in it.

--@ helper fair_now
-- fair_now(): the server's clock, as (ms, µs).
local function fair_now()
  local t = redis.call('time')
  local s, us = tonumber(t[1]), tonumber(t[2])
  return s * 1000 + math.floor(us / 1000), s * 1000000 + us
end

--@ helper fair_drop
-- fair_drop(fq, fd, fe, nonce): take one entry out of the queue; 1 if it was there.
local function fair_drop(fq, fd, fe, nonce)
  redis.call('zrem', fd, nonce)
  redis.call('hdel', fe, nonce, '#' .. nonce)
  return redis.call('zrem', fq, nonce)
end

--@ helper fair_hand_off uses next_token fmt
-- fair_hand_off(hash, fence, fq, fd, fe, q, now, retention, me, my_lease): the lock is free
-- (no hash): make the first live entry the owner, with a fresh fencing token, and tell only its
-- process ('+<nonce> <token> <lease ms>' on its channel; '+<nonce>/<try> ...' when the entry
-- numbers the try that last pushed it on). Dead entries are dropped on the way.
-- The hold's lease is the entry's own time left (at most its lease): a hold handed to a waiter
-- that died is stranded no longer than its entry would have lived; the waiter's process
-- lengthens it within 5 ms. The caller itself (`me`, a try of the head) gets `my_lease` in
-- full and no message. Returns the token when the caller got it, 0 when someone else did, -1
-- when nobody live is queued (the queue is then gone).
local function fair_hand_off(hash, fence, fq, fd, fe, q, now, retention, me, my_lease)
  local dead = redis.call('zrangebyscore', fd, '-inf', now, 'limit', 0, 200)
  for _, nonce in ipairs(dead) do
    redis.call('zrem', fq, nonce)
    redis.call('hdel', fe, nonce, '#' .. nonce)
  end
  if #dead > 0 then
    redis.call('zremrangebyscore', fd, '-inf', now)
  end
  while true do
    local head = redis.call('zrange', fq, 0, 0)[1]
    if not head then
      redis.call('del', fd, fe)
      return -1
    end
    local deadline = redis.call('zscore', fd, head)
    local entry, try = unpack(redis.call('hmget', fe, head, '#' .. head))
    redis.call('zrem', fq, head)
    redis.call('zrem', fd, head)
    redis.call('hdel', fe, head, '#' .. head)
    if deadline and entry and tonumber(deadline) > now then
      local count, lease, owner, info, channel =
        string.match(entry, '^(%d+)|(%d+)|([^|]*)|([^|]*)|(.*)$')
      local ttl = math.min(tonumber(lease), tonumber(deadline) - now)
      if head == me then
        ttl = tonumber(my_lease)
      end
      local token = next_token(fence, ttl + retention)
      redis.call('hset', hash, owner, count, ':t', fmt(token), ':i', info, ':l', ttl, ':n', head)
      if redis.call('exists', fq, q) > 0 then
        redis.call('hset', hash, ':w', 1)  -- its release wakes the next
      end
      redis.call('pexpire', hash, ttl)
      if head == me then
        return token
      end
      local named = try and (head .. '/' .. try) or head
      redis.call('publish', channel, '+' .. named .. ' ' .. fmt(token) .. ' ' .. fmt(ttl))
      return 0
    end
  end
end

--@ helper fair_pass_on uses fair_now fair_hand_off wake_one
-- fair_pass_on(hash, fence, fq, fd, fe, q, retention, waited): a hold ends (its last release,
-- or a wait that gives back what it was handed): free it, hand it straight to the first live
-- queued waiter, or, with nobody live queued and the hold flagged as waited on (`waited`, its
-- ':w'), wake a process of the plain registry `q` as lock_release does.
local function fair_pass_on(hash, fence, fq, fd, fe, q, retention, waited)
  redis.call('del', hash)
  local got = -1
  if redis.call('exists', fq) == 1 then
    local now = fair_now()
    got = fair_hand_off(hash, fence, fq, fd, fe, q, now, retention, '', '0')
  end
  if got < 0 and waited then
    wake_one(q)
  end
end
