package ipvs

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"syscall"

	libipvs "github.com/moby/ipvs"

	"github.com/onehop/onehop/portal"
)

// ReasonVirtualServerFailed is the event reason of a virtual server the
// kernel refused: that Service port is not served on that address, every
// other one is.
const ReasonVirtualServerFailed = "VirtualServerFailed"

// probeMark is the firewall mark of the throwaway virtual server that asks
// the kernel whether it has a scheduler. Nothing marks packets with it, and
// the virtual server lives for two netlink messages.
const probeMark = 0x0e4b7a11

// schedulerErr reports whether the kernel can run the IPVS scheduler
// name: nil when it can, the kernel's refusal (its ip_vs_<name> module
// cannot be loaded) when it cannot. The answer is remembered; a full sync
// forgets the refusals (see forgetRefusals), so that a module loaded later
// is found. Other errors are not remembered and refuse nothing: the
// virtual servers themselves then fail and are reported.
func (b *Backend) schedulerErr(name string) error {
	if err, ok := b.scheds[name]; ok {
		return err
	}
	probe := &libipvs.Service{FWMark: probeMark, AddressFamily: syscall.AF_INET, SchedName: name, Netmask: 0xffffffff}
	err := b.ipvs.NewService(probe)
	if errors.Is(err, syscall.EEXIST) { // left by a process that stopped in between
		_ = b.ipvs.DelService(probe)
		err = b.ipvs.NewService(probe)
	}
	switch {
	case err == nil:
		if err := b.ipvs.DelService(probe); err != nil && !isNotExist(err) {
			b.log.Warn("ipvs: removing the scheduler probe", "scheduler", name, "err", err)
		}
		b.scheds[name] = nil
	case errors.Is(err, syscall.ENOENT):
		b.scheds[name] = fmt.Errorf("this node's kernel has no IPVS scheduler %q (module ip_vs_%s): %w", name, name, err)
		b.log.Warn("ipvs: scheduler not available; Services asking for it get the default", "scheduler", name, "default", b.sched, "err", err)
	default:
		return nil
	}
	return b.scheds[name]
}

// forgetRefusals makes the next schedulerErr ask the kernel again about
// the schedulers it refused.
func (b *Backend) forgetRefusals() {
	maps.DeleteFunc(b.scheds, func(_ string, err error) bool { return err != nil })
}

// refusedSchedulers asks the kernel about every scheduler the given
// Services name in their onehop.io/scheduler annotation and returns those
// it refused, for planInput.Refused.
func (b *Backend) refusedSchedulers(services map[portal.ServiceKey]*portal.Service, keys []portal.ServiceKey) map[string]bool {
	for _, k := range keys {
		s := services[k]
		if s == nil {
			continue
		}
		for _, p := range s.Portals {
			if p != nil && p.Scheduler != "" && p.Scheduler != b.sched {
				_ = b.schedulerErr(p.Scheduler)
			}
		}
	}
	out := map[string]bool{}
	for name, err := range b.scheds {
		if err != nil {
			out[name] = true
		}
	}
	return out
}

// syncProblems collects what one sync could not do as the Services asked,
// per Service, for the ones it looked at.
type syncProblems struct {
	looked map[portal.ServiceKey]bool
	found  map[portal.ServiceKey][]portal.Problem
}

func newSyncProblems() *syncProblems {
	return &syncProblems{looked: map[portal.ServiceKey]bool{}, found: map[portal.ServiceKey][]portal.Problem{}}
}

func (sp *syncProblems) add(k portal.ServiceKey, reason, format string, args ...any) {
	sp.found[k] = append(sp.found[k], portal.Problem{Service: k, Reason: reason, Message: fmt.Sprintf(format, args...)})
}

// schedulerProblems adds a problem for each port of the looked-at Services
// whose scheduler the kernel refused.
func (sp *syncProblems) schedulerProblems(b *Backend, services map[portal.ServiceKey]*portal.Service) {
	for k := range sp.looked {
		s := services[k]
		if s == nil {
			continue
		}
		for _, p := range s.Portals {
			if p == nil || p.Scheduler == "" {
				continue
			}
			if err := b.scheds[p.Scheduler]; err != nil {
				sp.add(k, portal.ReasonInvalidScheduler, "annotation %s: %v; port %s uses the node's default scheduler %q",
					portal.AnnotationScheduler, err, p.Key.Port, b.sched)
			}
		}
	}
}

// report returns the problems of sp that were not reported already, and
// remembers what each looked-at Service's problems now are: a problem is
// reported once while it lasts, and again if it goes away and comes back.
func (b *Backend) report(sp *syncProblems) []portal.Problem {
	var out []portal.Problem
	for k := range sp.looked {
		old := b.problems[k]
		now := map[string]bool{}
		for _, p := range sp.found[k] {
			key := p.Reason + " " + p.Message
			if !now[key] && !old[key] {
				out = append(out, p)
			}
			now[key] = true
		}
		if len(now) == 0 {
			delete(b.problems, k)
		} else {
			b.problems[k] = now
		}
	}
	slices.SortFunc(out, func(a, b portal.Problem) int {
		return cmp.Or(strings.Compare(a.Service.String(), b.Service.String()), strings.Compare(a.Message, b.Message))
	})
	return out
}

// failingServices are the Services with a virtual server the kernel
// refused, which every sync tries again.
func (b *Backend) failingServices() []portal.ServiceKey {
	var out []portal.ServiceKey
	for _, f := range b.failed {
		out = append(out, f.service)
	}
	return out
}

// vsFailure is a virtual server the kernel refused in its last sync.
type vsFailure struct {
	service portal.ServiceKey
	err     error
}
