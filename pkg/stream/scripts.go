package stream

import "github.com/redis/go-redis/v9"

// The scripts below each touch one stream (KEYS[1]), so they run on any
// Redis deployment, Cluster included. They fence an operation on an entry by
// checking, atomically, that this consumer still owns it in the group's
// pending entries list; they return the ids it no longer owns.

// scriptBatch bounds the ids passed to one script call (Lua's unpack limit).
const scriptBatch = 512

// renewScript resets the idle time of owned entries (XCLAIM with min-idle 0
// and JUSTID, which does not count a delivery).
// ARGV: group, consumer, ids...
var renewScript = redis.NewScript(`
local stream, group, consumer = KEYS[1], ARGV[1], ARGV[2]
local keep, lost = {}, {}
for i = 3, #ARGV do
  local p = redis.call('XPENDING', stream, group, ARGV[i], ARGV[i], 1)
  if p[1] and p[1][2] == consumer then keep[#keep + 1] = ARGV[i] else lost[#lost + 1] = ARGV[i] end
end
if #keep > 0 then
  local args = {stream, group, consumer, 0}
  for _, id in ipairs(keep) do args[#args + 1] = id end
  args[#args + 1] = 'JUSTID'
  redis.call('XCLAIM', unpack(args))
end
return lost
`)

// ackScript acknowledges owned entries.
// ARGV: group, consumer, ids...
var ackScript = redis.NewScript(`
local stream, group, consumer = KEYS[1], ARGV[1], ARGV[2]
local keep, lost = {}, {}
for i = 3, #ARGV do
  local p = redis.call('XPENDING', stream, group, ARGV[i], ARGV[i], 1)
  if p[1] and p[1][2] == consumer then keep[#keep + 1] = ARGV[i] else lost[#lost + 1] = ARGV[i] end
end
if #keep > 0 then redis.call('XACK', stream, group, unpack(keep)) end
return lost
`)

// releaseScript sets the idle time of owned entries, so that other consumers
// may claim them after Lease - idle, and optionally rewrites their delivery
// count (RETRYCOUNT; -1 leaves it).
// ARGV: group, consumer, idle-ms, then pairs of id, retry-count.
var releaseScript = redis.NewScript(`
local stream, group, consumer, idle = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local lost = {}
for i = 4, #ARGV, 2 do
  local id, rc = ARGV[i], tonumber(ARGV[i + 1])
  local p = redis.call('XPENDING', stream, group, id, id, 1)
  if p[1] and p[1][2] == consumer then
    if rc >= 0 then
      redis.call('XCLAIM', stream, group, consumer, 0, id, 'IDLE', idle, 'RETRYCOUNT', rc, 'JUSTID')
    else
      redis.call('XCLAIM', stream, group, consumer, 0, id, 'IDLE', idle, 'JUSTID')
    end
  else
    lost[#lost + 1] = id
  end
end
return lost
`)

// deleteConsumerScript deletes a consumer only when it has no pending
// entries: deleting one that has them would drop them from the group for
// good (redis/redis#9745). Returns 1 when deleted, 0 otherwise.
// ARGV: group, consumer
var deleteConsumerScript = redis.NewScript(`
local p = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2])
if p[1] then return 0 end
redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
return 1
`)
