package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/shardstock/shardstock/bench/internal/loadgen"
	"github.com/shardstock/shardstock/internal/proccpu"
)

// cpuHooks wraps a run's load hooks to read, at the load's start and end,
// the CPU time of the target's server side (serverRoots) and of this
// process, into *out. The target is read at the start, after Setup (the
// memory target starts its server there).
func (mr *modelRun) cpuHooks(ctx context.Context, name string, target func() loadgen.Target, started, ended func(), out **loadgen.CPU) (func(), func()) {
	var parts []serverPart
	var c loadgen.CPU
	var server0 []time.Duration
	var client0 time.Duration
	var marks []proccpu.Marks // of each part's roots at the start, to tell whether one ended
	// read is each part's CPU time now.
	read := func() ([]time.Duration, error) {
		ts := make([]time.Duration, len(parts))
		for i, p := range parts {
			t, err := proccpu.Tree(p.pids...)
			if err != nil {
				return nil, err
			}
			ts[i] = t
		}
		return ts, nil
	}
	return func() {
			if started != nil {
				started()
			}
			parts, c.Procs, c.Err = mr.serverRoots(ctx, name, target())
			for _, p := range parts {
				if c.Err != nil {
					break
				}
				var m proccpu.Marks
				m, c.Err = proccpu.Mark(p.pids...)
				marks = append(marks, m)
			}
			if c.Err == nil {
				server0, c.Err = read()
			}
			client0 = proccpu.Self()
		}, func() {
			c.Client = proccpu.Self() - client0
			for i, m := range marks {
				if pid, gone := m.Gone(); gone && c.Err == nil {
					// A crash-restarted Postgres, say: what the old
					// processes used is nowhere to be read.
					c.Err = fmt.Errorf("%s's process %d ended during the load", parts[i].label, pid)
				}
			}
			if c.Err == nil {
				var server1 []time.Duration
				server1, c.Err = read()
				for i := range server1 {
					d := server1[i] - server0[i]
					c.Server += d
					if len(parts) > 1 {
						c.Parts = append(c.Parts, loadgen.CPUPart{Name: parts[i].label, Time: d})
					}
				}
			}
			*out = &c
			if ended != nil {
				ended()
			}
		}
}

// serverPart is one part of a target's server side: processes rooted at
// pids, named label in the CPU split.
type serverPart struct {
	label string
	pids  []int
}

// serverRoots returns the parts of a target's server side, and what
// they are: the dev stack's and its Postgres for shardstock under -stack
// (-server-pids otherwise), the in-memory server, the Postgres of the
// Postgres baselines, the redis-server of the Redis ones.
func (mr *modelRun) serverRoots(ctx context.Context, name string, t loadgen.Target) ([]serverPart, string, error) {
	switch name {
	case "shardstock":
		if mr.stack != nil && mr.stack.cmd != nil && mr.stack.cmd.Process != nil {
			pm, err := proccpu.Postmaster(ctx, mr.stack.databaseURL)
			if err != nil {
				return nil, "", err
			}
			return []serverPart{{"Go", []int{mr.stack.cmd.Process.Pid}}, {"Postgres", []int{pm}}}, "allocator, shard servers and their Postgres", nil
		}
		if len(mr.serverPids) > 0 {
			return []serverPart{{"given", mr.serverPids}}, fmt.Sprintf("processes %v (-server-pids) and their children", mr.serverPids), nil
		}
		return nil, "", errors.New("start the stack with -stack, or name its processes with -server-pids")
	case loadgen.CeilingTarget:
		pid, err := serverPid(t)
		if err != nil {
			return nil, "", err
		}
		return []serverPart{{"server", []int{pid}}}, "the in-memory server", nil
	case redisAPIName, redisAPIBareName:
		pid, err := serverPid(t)
		if err != nil {
			return nil, "", err
		}
		pids, err := redisServerPids(mr.opts.redisAddr)
		if err != nil {
			return nil, "", err
		}
		return []serverPart{{"API server", []int{pid}}, {"redis-server", pids}}, "the API server and redis-server", nil
	case "naive", "onerow", "subrows":
		pm, err := proccpu.Postmaster(ctx, mr.opts.databaseURL)
		if err != nil {
			return nil, "", err
		}
		return []serverPart{{"Postgres", []int{pm}}}, "Postgres", nil
	case "redis", "redis-fsync":
		pids, err := redisServerPids(mr.opts.redisAddr)
		if err != nil {
			return nil, "", err
		}
		return []serverPart{{"redis-server", pids}}, "redis-server", nil
	}
	return nil, "", fmt.Errorf("no server processes known for target %s", name)
}

// serverPid is the process of a target that runs its server as a child of
// loadgen (memory, redis-api), once its Setup started it.
func serverPid(t loadgen.Target) (int, error) {
	if m, ok := t.(interface{ ServerPid() int }); ok && m.ServerPid() > 0 {
		return m.ServerPid(), nil
	}
	return 0, fmt.Errorf("the %s server is not running", t.Name())
}

// redisServerPids are the redis-server processes listening on addr's port.
func redisServerPids(addr string) ([]int, error) {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	pids, err := proccpu.ByCommand("redis-server", ":"+port)
	if err != nil || len(pids) == 0 {
		return nil, fmt.Errorf("no redis-server for port %s on this machine", port)
	}
	return pids, nil
}
