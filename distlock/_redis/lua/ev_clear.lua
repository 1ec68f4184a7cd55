-- Clear an event: wait() blocks again until the next set(). Waiters a set() already took (in
-- its 'taken' set) still return True. A script, not a bare DEL, because a state change is
-- never sent twice (a DEL the client sent again after a lost reply could undo a set() that
-- another process made in between); a lost reply surfaces as an error instead.
-- KEYS[1]  flag: string '1', exists while the event is set
-- return   1 when this call cleared the event; 0 when it was clear already.
return redis.call('del', KEYS[1])
