--[[ tx_register: create or update a resource's registry entry (RedisBackend.register_resource).

KEYS[1]  P:meta:R      hash: version, at (µs, absent until a commit), metadata
KEYS[2]  P:res         registered resource names
ARGV[1]  resource name
ARGV[2]  metadata, JSON text of an object (replaces the stored one)

Returns  1. The version and last commit time are kept (version 0 when new).
]]
redis.call('HSET', KEYS[1], 'metadata', ARGV[2])
redis.call('HSETNX', KEYS[1], 'version', '0')
redis.call('SADD', KEYS[2], ARGV[1])
return 1
