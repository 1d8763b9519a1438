--[[ list_runs: one page of a tenant's runs in seq order, records included.

KEYS[1]  the index to page: P runs, P runs-status:<seg(st)>,
         P runs-session:<seg(s)> or P runs-ss:<seg(s)>:<seg(st)>
ARGV[1]  P, the tenant prefix; each run's keys are built from it
ARGV[2]  after: only runs with seq > after
ARGV[3]  how many (the page size plus one, so the caller knows whether more follow)

Returns  {run_id, run, run_id, run, ...} with run as in get_run.
Writes   nothing. seq is fixed at creation, so paging by it neither skips nor
         repeats a run updated between pages.
]]
return page(KEYS[1], ARGV[2], ARGV[3], run_reply)
