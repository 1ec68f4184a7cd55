-- Shared by every script: prepended once when the scripts are loaded, so each script stays
-- one EVALSHA and one round trip.
--
-- next_token(fence_key): the next fencing token of a name, strictly greater than every
-- token granted before, also after a restart of a server that kept nothing: the token is
-- floored by the server's clock in microseconds (TIME), and grants are far slower than one
-- per microsecond. Numbers stay below 2^53, so Lua's doubles hold them exactly, and the
-- stored string is formatted with '%.0f' because Lua's default would print an exponent.
local function next_token(fence_key)
  local now = redis.call('time')
  local floor = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local last = tonumber(redis.call('get', fence_key) or '0')
  local token = math.max(last + 1, floor)
  redis.call('set', fence_key, string.format('%.0f', token))
  return token
end

-- held_reply(key): the reply "someone else holds it": -(pttl + 1), where pttl is the
-- holder's remaining lease in ms, 0 when unknown (no expiry). Always <= -1.
local function held_reply(key)
  local pttl = redis.call('pttl', key)
  if pttl < 0 then pttl = 0 end
  return -(pttl + 1)
end
