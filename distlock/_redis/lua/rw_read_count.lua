-- Count the live readers of a read/write lock (read-only).
-- KEYS[1]  readers: sorted set, '<owner>#<token>' -> lease deadline (server ms)
-- return   how many read holds have a deadline still ahead (expired ones are not counted)
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('zcount', KEYS[1], '(' .. string.format('%.0f', now), '+inf')
