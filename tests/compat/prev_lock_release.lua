-- The assembled lock_release script of the previous release (distlock b49bc5c), kept to test that
-- a process of that release and one of this release exclude each other on the same name.

-- The registry of waiting processes of an exclusive lock: a sorted set whose members are the
-- wake-up channels of the processes that have threads waiting (one channel per process and
-- lock, named by the client), scored by the entry's deadline on the server clock (ms). A
-- release wakes exactly one waiting process, not every subscriber; entries of processes that
-- died expire by their deadline.

local function now_ms()
  local t = redis.call('time')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- wake_one(queue): hint the longest-registered live waiting process, and take it off the
-- registry (its waiter registers again if it loses the race for the lock).
local function wake_one(queue)
  redis.call('zremrangebyscore', queue, '-inf', now_ms())
  local first = redis.call('zpopmin', queue)
  if first[1] then
    redis.call('publish', first[1], '1')
  end
end
-- Release some or all of an exclusive owner-counted hold. The last release frees the lock and,
-- when the hold was flagged as waited on (':w'), wakes the longest-waiting process.
-- KEYS[1]  lock hash
-- KEYS[2]  registry of waiting processes (see lock_acquire)
-- ARGV[1]  owner id
-- ARGV[2]  token of the hold the caller believes it has
-- ARGV[3]  count to release; absent means 1; '0' releases all of it (_release_save())
-- return   the count still held (0 when the lock is now free);
--          -1 when the hold is gone or is someone else's (the caller's lease is lost).
local fields = redis.call('hmget', KEYS[1], ARGV[1], ':t', ':w')
local count = tonumber(fields[1])
if count == nil or fields[2] ~= ARGV[2] then
  return -1
end
local n = tonumber(ARGV[3] or '1')
if n > 0 and n < count then
  -- Out of memory (maxmemory under noeviction), Redis refuses a script's first write when that
  -- command may use memory: HINCRBY may; PEXPIRE and DEL may not. Setting the TTL to what it
  -- is makes the HINCRBY a later write, which Redis allows, so giving back a level never fails
  -- for want of memory. (The `#!lua flags=allow-oom` shebang would say so directly, but needs
  -- Redis 7 and breaks fakeredis.)
  local pttl = redis.call('pttl', KEYS[1])
  if pttl > 0 then
    redis.call('pexpire', KEYS[1], pttl)
  end
  return redis.call('hincrby', KEYS[1], ARGV[1], -n)
end
redis.call('del', KEYS[1])
if fields[3] then
  wake_one(KEYS[2])
end
return 0

