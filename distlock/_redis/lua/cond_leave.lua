-- A waiter looks whether it was notified, or leaves the queue (timeout, error), in one step:
-- a notification that picked it in the same instant is taken up, never wasted.
-- KEYS[1]  queue: sorted set, waiter id -> arrival; the waiters not picked yet
-- KEYS[2]  leases: sorted set, waiter id -> lease deadline, same waiters
-- ARGV[1]  waiter id
-- ARGV[2]  '1' to leave the queue when still in it; '0' only to look
-- return   0 when not notified ('0': still queued; '1': now off the queue);
--          1 when no longer queued: a notify picked it (or, when the server lost its data or
--          the waiter's lease ran out, nobody can tell: waking is then the safe answer).
if redis.call('zscore', KEYS[1], ARGV[1]) then
  if ARGV[2] == '1' then
    redis.call('zrem', KEYS[1], ARGV[1])
    redis.call('zrem', KEYS[2], ARGV[1])
  end
  return 0
end
redis.call('zrem', KEYS[2], ARGV[1])
return 1
