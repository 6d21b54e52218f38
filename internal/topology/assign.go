package topology

import (
	"hash/fnv"
)

// Assign maps every partition in [0, partitions) to the server with the
// highest rendezvous score for it. It is pure: every member and allocator
// that sees the same servers computes the same map. Adding a server moves
// only the partitions it now wins, about 1/n of them; removing one moves
// only its own. With no servers the map is empty. Duplicate ids count once.
func Assign(partitions int, servers []string) map[int32]string {
	out := make(map[int32]string, max(partitions, 0))
	if len(servers) == 0 {
		return out
	}
	hashes := make([]uint64, len(servers))
	for i, s := range servers {
		hashes[i] = hashID(s)
	}
	for p := range int32(max(partitions, 0)) {
		best, bestScore := -1, uint64(0)
		for i, s := range servers {
			sc := score(p, hashes[i])
			// Ties (vanishingly rare) go to the larger id so the result
			// does not depend on the order of servers.
			if best < 0 || sc > bestScore || (sc == bestScore && s > servers[best]) {
				best, bestScore = i, sc
			}
		}
		out[p] = servers[best]
	}
	return out
}

// hashID hashes a server id once per Assign.
func hashID(id string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(id))
	return h.Sum64()
}

// score is the rendezvous weight of (partition, server). FNV alone mixes
// short, similar inputs poorly, so both sides go through the splitmix64
// finaliser before and after combining.
func score(p int32, idHash uint64) uint64 {
	return mix64(mix64(idHash) ^ mix64(uint64(p)+0x9e3779b97f4a7c15))
}

func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
