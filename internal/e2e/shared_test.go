package e2e

import "testing"

// sharedShardServers is the shared stack's shard servers: as many as the
// largest stack its tests had alone (the source case's three), so that
// their calls still cross servers.
const sharedShardServers = 3

// sharedTests need of a stack only its public and admin APIs and SKUs of
// their own, which no other test here uses: none stops or signals a
// process, changes the topology or the placement, reads a stack-wide
// count, or needs a flag of its own. A new test that fits adds itself
// here, as a func(*testing.T, *stack), and gets the shared stack (see
// TestE2E_Shared); one that does not starts its own with newStack and
// besideOthers.
var sharedTests = []struct {
	name string
	run  func(t *testing.T, s *stack)
}{
	{"SourceCase", sharedSourceCase},
	{"NoFalseSoldOut", sharedNoFalseSoldOut},
	{"Protocols", sharedProtocols},
	{"StaleSKUCache", sharedStaleSKUCache},
	{"Admin", sharedAdmin},
	{"HostileInput", sharedHostileInput},
}

// TestE2E_Shared runs sharedTests as its subtests on one stack, beside one
// another (as many at once as -parallel allows), instead of each on a
// stack of its own: one start-up (an etcd, a database, three shard
// servers, an allocator and the hand-overs between them) instead of six,
// which on two cores was CPU the neighbouring tests wanted. Each subtest
// sees the stack through stack.as: its failures are its own. Run one with
// -run 'TestE2E_Shared/Admin$'.
func TestE2E_Shared(t *testing.T) {
	besideOthers(t)
	s := newStack(t, sharedShardServers)
	for _, tc := range sharedTests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.run(t, s.as(t))
		})
	}
}
