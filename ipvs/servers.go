package ipvs

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"syscall"
	"time"

	libipvs "github.com/moby/ipvs"

	"github.com/onehop/onehop/portal"
)

// applyServers sends the IPVS differences between have and want. A virtual
// server the kernel refuses is recorded in b.failed and sp, and the others
// go on; one that exists already without onehop knowing it (kube-proxy's,
// or onehop's after its state file was lost) is adopted: updated to what
// the Service asks for. With haveFromPlan, have is the applied plan rather
// than the kernel, and the failed virtual servers in it are created (or
// adopted) again.
func (b *Backend) applyServers(have, want *plan, haveFromPlan bool, changed map[portal.PortKey]bool, sp *syncProblems) (int, error) {
	msgs := 0
	now := time.Now()
	for k, v := range want.Servers {
		old := have.Servers[k]
		if _, failed := b.failed[k]; failed && haveFromPlan {
			old = nil
		}
		n, err := b.applyServer(k, v, old, now, changed)
		msgs += n
		if err != nil && !refusedByKernel(err) {
			return msgs, fmt.Errorf("ipvs: %s for %s: %w", k, v.Portal, err) // the node's trouble, not the Service's
		}
		if err != nil {
			if prev, ok := b.failed[k]; !ok || prev.err.Error() != err.Error() {
				b.log.Error("ipvs: virtual server not programmed; the other Services are", "service", v.Portal.String(), "virtual_server", k.String(), "err", err)
			}
			b.failed[k] = vsFailure{service: v.Portal.Service, err: err}
			sp.add(v.Portal.Service, ReasonVirtualServerFailed, "%s not served at %s: %v", v.Portal.Port, k, err)
			continue
		}
		delete(b.failed, k)
	}
	if !haveFromPlan {
		for k := range b.failed {
			if _, ok := want.Servers[k]; !ok {
				delete(b.failed, k) // no longer wanted
			}
		}
	}
	for k, old := range have.Servers {
		if _, ok := want.Servers[k]; ok {
			continue
		}
		msgs++
		delete(b.failed, k)
		if err := b.ipvs.DelService(toService(old)); err != nil && !isNotExist(err) {
			return msgs, fmt.Errorf("ipvs: removing %s: %w", k, err)
		}
		for dk := range b.drains {
			if dk.vs == k {
				delete(b.drains, dk)
			}
		}
		changed[old.Portal] = true
	}
	return msgs, nil
}

// applyServer brings one virtual server from old (nil: not in the kernel,
// as far as onehop knows) to v.
func (b *Backend) applyServer(k vsKey, v, old *virtualServer, now time.Time, changed map[portal.PortKey]bool) (int, error) {
	msgs := 0
	svc := toService(v)
	switch {
	case old == nil:
		msgs++
		err := b.ipvs.NewService(svc)
		if errors.Is(err, syscall.EEXIST) {
			msgs += 2
			old, err = b.adopt(svc, v)
		} else if err != nil {
			err = fmt.Errorf("adding it: %w", err)
		}
		if err != nil {
			return msgs, err
		}
		if old == nil {
			old = &virtualServer{Dests: map[netip.AddrPort]int{}}
		}
		changed[v.Portal] = true
	case !old.sameService(v):
		msgs++
		if err := b.ipvs.UpdateService(svc); err != nil {
			return msgs, fmt.Errorf("updating it: %w", err)
		}
		changed[v.Portal] = true
	}
	for d, w := range v.Dests {
		ow, ok := old.Dests[d]
		switch {
		case !ok:
			msgs++
			if err := b.ipvs.NewDestination(svc, toDest(d, w)); err != nil {
				return msgs, fmt.Errorf("adding endpoint %s: %w", d, err)
			}
			changed[v.Portal] = true
		case ow != w:
			msgs++
			if err := b.ipvs.UpdateDestination(svc, toDest(d, w)); err != nil {
				return msgs, fmt.Errorf("weight of endpoint %s: %w", d, err)
			}
			changed[v.Portal] = true
		}
		delete(b.drains, drainKey{k, d})
	}
	for d, ow := range old.Dests {
		if _, ok := v.Dests[d]; ok {
			continue
		}
		dk := drainKey{k, d}
		if k.Proto == portal.UDP {
			// No graceful termination for UDP: flows have no end, and
			// expire_nodest_conn moves them on their next packet.
			msgs++
			if err := b.ipvs.DelDestination(svc, toDest(d, 0)); err != nil && !isNotExist(err) {
				return msgs, fmt.Errorf("removing endpoint %s: %w", d, err)
			}
			delete(b.drains, dk)
			changed[v.Portal] = true
			continue
		}
		if ow != 0 {
			msgs++
			if err := b.ipvs.UpdateDestination(svc, toDest(d, 0)); err != nil {
				return msgs, fmt.Errorf("draining endpoint %s: %w", d, err)
			}
			changed[v.Portal] = true
		}
		if _, ok := b.drains[dk]; !ok {
			b.drains[dk] = now
		}
	}
	return msgs, nil
}

// logForeign says, once per process, which virtual servers that onehop
// did not make it leaves alone: those at no address, port and protocol of a
// Service (the others it adopts).
func (b *Backend) logForeign(foreign []vsKey, want *plan) {
	var left []string
	for _, k := range foreign {
		if want.Servers[k] == nil {
			left = append(left, k.String())
		}
	}
	if len(left) == 0 {
		return
	}
	slices.Sort(left)
	b.log.Info("ipvs: virtual servers onehop did not make and no Service asks for are left alone",
		"count", len(left), "first", left[:min(len(left), 10)])
}

// refusedByKernel reports whether err is the kernel refusing one virtual
// server or destination as asked (a scheduler it lacks, a value it does not
// take, one that exists already and could not be adopted), rather than
// trouble of the node (out of memory, netlink itself failing), which fails
// the sync.
func refusedByKernel(err error) bool {
	for _, e := range []syscall.Errno{syscall.EINVAL, syscall.ENOENT, syscall.EEXIST, syscall.ESRCH, syscall.EOPNOTSUPP,
		syscall.EAFNOSUPPORT, syscall.EPROTONOSUPPORT, syscall.ERANGE} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// adopt takes over the virtual server the kernel already has at svc's
// address, port and protocol: it is onehop's to program, whoever made it
// (kube-proxy's IPVS mode leaves its virtual servers behind, and a lost
// state file hides onehop's own NodePort ones), as kube-proxy updates an
// existing one. Its settings are updated to v's, and its destinations are
// returned as old ones, so that those v does not have drain and go; a
// destination forwarded otherwise than by masquerade gets weight -1, so
// that it is updated.
func (b *Backend) adopt(svc *libipvs.Service, v *virtualServer) (*virtualServer, error) {
	cur, err := b.ipvs.GetService(svc)
	if err != nil {
		return nil, fmt.Errorf("it exists, but reading it failed: %w", err)
	}
	old := fromService(v.Key, cur)
	ds, err := b.ipvs.GetDestinations(cur)
	if err != nil {
		return nil, fmt.Errorf("it exists, but reading its destinations failed: %w", err)
	}
	for _, d := range ds {
		ap, ok := destAddr(d)
		if !ok {
			continue
		}
		w := d.Weight
		if d.ConnectionFlags&libipvs.ConnectionFlagFwdMask != libipvs.ConnectionFlagMasq {
			w = -1
		}
		old.Dests[ap] = w
	}
	if !old.sameService(v) || cur.Flags&^(svcFlagPersistent|svcFlagHashed|svcFlagSchedFallback) != 0 {
		if err := b.ipvs.UpdateService(svc); err != nil {
			return nil, fmt.Errorf("it exists, and updating it failed: %w", err)
		}
	}
	b.log.Info("ipvs: adopted an existing virtual server", "service", v.Portal.String(), "virtual_server", v.Key.String(),
		"scheduler", cur.SchedName, "destinations", len(old.Dests))
	return old, nil
}

func isNotExist(err error) bool {
	return errors.Is(err, syscall.ESRCH) || errors.Is(err, syscall.ENOENT)
}
