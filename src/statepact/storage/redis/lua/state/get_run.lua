--[[ get_run: read one run.

KEYS[1]  P runh:<seg(run_id)>   (routes the call to the tenant's slot)
ARGV[1]  P, the tenant prefix   <ns>:state:{<seg(tenant)>}:
ARGV[2]  run_id

Returns  the run (RUN_FIELDS in order, then the blob), or nil.
Writes   nothing.
]]
return run_reply(ARGV[1], ARGV[2])
