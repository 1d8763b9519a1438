--[[ get_session: read one session.

KEYS[1]  P sessionh:<seg(session_id)>
ARGV[1]  P, the tenant prefix
ARGV[2]  session_id

Returns  the session (SESSION_FIELDS, then the blob), or nil.
]]
return session_reply(ARGV[1], ARGV[2])
