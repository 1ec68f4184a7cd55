-- Shared by every script: prepended once when the scripts are loaded, so each script stays
-- one EVALSHA and one round trip.
--
-- next_token(fence_key): the next fencing token of a name, strictly greater than every
-- token granted before, also after a restart of a server that kept nothing.
-- The counter is one INCR. When INCR finds no counter (the name's first grant, or the server
-- lost its data), the counter starts at the server's clock in microseconds (TIME) instead of
-- at 1. Earlier tokens can't be above that: each started from an earlier clock reading and grew
-- by one per grant, and grants (script runs, one at a time) take well over a microsecond each.
-- Tokens stay below 2^53, exact in Lua's doubles; the clock is stored with '%.0f' because
-- Lua's default number format would write an exponent.
local function next_token(fence_key)
  local token = redis.call('incr', fence_key)
  if token == 1 then
    local now = redis.call('time')
    token = tonumber(now[1]) * 1000000 + tonumber(now[2])
    redis.call('set', fence_key, string.format('%.0f', token))
  end
  return token
end

-- held_reply(key): the reply "someone else holds it": -(pttl + 1), where pttl is the
-- holder's remaining lease in ms, 0 when unknown (no expiry). Always <= -1. A lease about to
-- run out (PTTL 0: under 1 ms left) is reported as 1 ms, not as unknown, so that its waiter
-- tries again at once instead of sleeping the whole wait cap.
local function held_reply(key)
  local pttl = redis.call('pttl', key)
  if pttl < 0 then pttl = 0 elseif pttl == 0 then pttl = 1 end
  return -(pttl + 1)
end
