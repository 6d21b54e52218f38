// Package proccpu measures the CPU time that processes on this machine
// spend, from /proc (Linux): a process tree's (its own, its live
// descendants', and what its exited children had used, which the kernel
// adds to the parent that reaped them), and this process's own. The load
// generator reads it before and after a load to report the server side's
// CPU per request beside the client's; benchmarks in the module's tests
// read a database's backends with it (pgtest.BackendsCPU).
package proccpu

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// clockTick is the unit of /proc/<pid>/stat's times (USER_HZ, 100 on
// Linux whatever the kernel's HZ).
const clockTick = 10 * time.Millisecond

// stat is what proccpu reads of one /proc/<pid>/stat.
type stat struct {
	ppid                         int
	utime, stime, cutime, cstime int64 // clock ticks
	start                        int64 // clock ticks after boot: with the pid, names one process
}

// readStat parses /proc/<pid>/stat. The command name (field 2) may hold
// spaces and parentheses: the fields after it start after its last ')'.
func readStat(pid int) (stat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return stat{}, err
	}
	return parseStat(string(b))
}

func parseStat(s string) (stat, error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return stat{}, errors.New("proccpu: no command name in stat")
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); ppid is field 4, utime..cstime 14..17,
	// starttime 22.
	if len(f) < 20 {
		return stat{}, errors.New("proccpu: short stat")
	}
	var st stat
	var err error
	num := func(k int) int64 {
		n, e := strconv.ParseInt(f[k], 10, 64)
		err = errors.Join(err, e)
		return n
	}
	st.ppid = int(num(1))
	st.utime, st.stime, st.cutime, st.cstime = num(11), num(12), num(13), num(14)
	st.start = num(19)
	return st, err
}

// Tree returns the CPU time of the processes rooted at roots: each root's
// and its live descendants' user and system time, plus what their exited
// children had used. A root that is gone counts nothing.
func Tree(roots ...int) (time.Duration, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	stats := map[int]stat{}
	children := map[int][]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := readStat(pid)
		if err != nil {
			continue // exited meanwhile
		}
		stats[pid] = st
		children[st.ppid] = append(children[st.ppid], pid)
	}
	var ticks int64
	seen := map[int]bool{}
	var walk func(pid int)
	walk = func(pid int) {
		st, ok := stats[pid]
		if !ok || seen[pid] {
			return
		}
		seen[pid] = true
		ticks += st.utime + st.stime + st.cutime + st.cstime
		for _, c := range children[pid] {
			walk(c)
		}
	}
	for _, r := range roots {
		walk(r)
	}
	return time.Duration(ticks) * clockTick, nil
}

// Marks names processes by pid and start time, so that a pid the kernel
// gave to a new process is told from the one marked.
type Marks map[int]int64

// Mark returns the marks of pids, all of which must be running.
func Mark(pids ...int) (Marks, error) {
	m := Marks{}
	for _, pid := range pids {
		st, err := readStat(pid)
		if err != nil {
			return nil, fmt.Errorf("proccpu: process %d: %w", pid, err)
		}
		m[pid] = st.start
	}
	return m, nil
}

// Gone returns a marked process that has ended since (or whose pid now
// names another), and whether there is one. Tree counts nothing of a
// root that is gone, nor what it had used: a difference of two Trees
// over its end is not its CPU.
func (m Marks) Gone() (int, bool) {
	for pid, start := range m {
		if st, err := readStat(pid); err != nil || st.start != start {
			return pid, true
		}
	}
	return 0, false
}

// Self returns this process's CPU time, user and system.
func Self() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// loopback reports whether host names this machine.
func loopback(host string) bool {
	if host == "localhost" || host == "" || strings.HasPrefix(host, "/") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Postmaster returns the pid of the Postgres server that databaseURL names,
// if it runs on this machine: the parent of the backend that answers.
func Postmaster(ctx context.Context, databaseURL string) (int, error) {
	u, err := url.Parse(databaseURL)
	if err == nil && !loopback(u.Hostname()) {
		return 0, fmt.Errorf("proccpu: Postgres at %s is not on this machine", u.Hostname())
	}
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var backend int
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		return 0, err
	}
	st, err := readStat(backend)
	if err != nil {
		return 0, fmt.Errorf("proccpu: Postgres backend %d not visible in /proc: %w", backend, err)
	}
	return st.ppid, nil
}

// ByCommand returns the pids of the processes whose command line starts
// with name and contains every one of args (for example redis-server and
// its ":6379").
func ByCommand(name string, args ...string) ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		cmd := strings.ReplaceAll(string(b), "\x00", " ")
		if !strings.HasPrefix(cmd, name) && !strings.Contains(cmd, "/"+name) {
			continue
		}
		match := true
		for _, a := range args {
			match = match && strings.Contains(cmd, a)
		}
		if match {
			out = append(out, pid)
		}
	}
	return out, nil
}
