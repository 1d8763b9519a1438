--[[ list_sessions: one page of a tenant's sessions in seq order, records included.

KEYS[1]  P sessions
ARGV[1]  P, the tenant prefix
ARGV[2]  after: only sessions with seq > after
ARGV[3]  how many (page size plus one)

Returns  {session_id, session, ...} with session as in get_session.
]]
return page(KEYS[1], ARGV[2], ARGV[3], session_reply)
