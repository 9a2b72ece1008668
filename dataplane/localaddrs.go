package dataplane

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// LocalAddrs returns the addresses of the interfaces of h's network
// namespace that a NodePort can be reached on, sorted: every address but
// loopback ones, IPv6 link-local ones (they need a zone to be reached), and
// those on the links named in skip (the IPVS dataplane's dummy link holds
// Service IPs, not node addresses).
func LocalAddrs(h *netlink.Handle, skip []string) ([]netip.Addr, error) {
	skipIdx := map[int]bool{}
	for _, name := range skip {
		if l, err := h.LinkByName(name); err == nil {
			skipIdx[l.Attrs().Index] = true
		}
	}
	list, err := h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("listing the node's addresses: %w", err)
	}
	var out []netip.Addr
	for _, a := range list {
		if a.IPNet == nil || skipIdx[a.LinkIndex] {
			continue
		}
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		if ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsUnspecified() {
			continue
		}
		out = append(out, ip)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out), nil
}

// WatchLocalAddrs calls fn with LocalAddrs of the network namespace behind
// netnsFD (-1: the current one) at once, then after every change of them,
// until ctx ends. Bursts of address events are coalesced into one call; fn
// is not called when the list did not change. It returns an error only
// when it cannot start; later netlink failures are logged and the
// subscription is opened again.
func WatchLocalAddrs(ctx context.Context, netnsFD int, log *slog.Logger, skip []string, fn func([]netip.Addr)) error {
	var h *netlink.Handle
	var err error
	// Only the route family: a handle of every family also opens XFRM,
	// which a kernel without xfrm_user refuses, and the agent would not
	// start for a socket it never uses.
	if netnsFD >= 0 {
		h, err = netlink.NewHandleAt(netns.NsHandle(netnsFD), unix.NETLINK_ROUTE)
	} else {
		h, err = netlink.NewHandle(unix.NETLINK_ROUTE)
	}
	if err != nil {
		return fmt.Errorf("netlink: %w", err)
	}
	defer h.Close()

	var last []netip.Addr
	reported := false
	report := func() {
		addrs, err := LocalAddrs(h, skip)
		if err != nil {
			log.ErrorContext(ctx, "cannot list the node's addresses; NodePorts keep the previous ones", "err", err)
			return
		}
		if reported && slices.Equal(addrs, last) {
			return
		}
		last, reported = addrs, true
		fn(slices.Clone(addrs))
	}

	for ctx.Err() == nil {
		updates := make(chan netlink.AddrUpdate, 64)
		done := make(chan struct{})
		failed := make(chan error, 1)
		opts := netlink.AddrSubscribeOptions{ErrorCallback: func(err error) {
			select {
			case failed <- err:
			default:
			}
		}}
		if netnsFD >= 0 {
			ns := netns.NsHandle(netnsFD)
			opts.Namespace = &ns
		}
		if err := netlink.AddrSubscribeWithOptions(updates, done, opts); err != nil {
			if !reported {
				return fmt.Errorf("netlink: following address changes: %w", err)
			}
			log.ErrorContext(ctx, "cannot follow the node's address changes; retrying", "err", err)
		} else {
			report() // after subscribing, so that no change falls between
			watchAddrUpdates(ctx, updates, failed, log, report)
		}
		close(done)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
			report()
		}
	}
	return nil
}

// watchAddrUpdates calls report after each burst of updates until ctx
// ends or the subscription fails.
func watchAddrUpdates(ctx context.Context, updates <-chan netlink.AddrUpdate, failed <-chan error, log *slog.Logger, report func()) {
	for {
		select {
		case <-ctx.Done():
			return
		case err := <-failed:
			log.WarnContext(ctx, "following the node's address changes failed; subscribing again", "err", err)
			return
		case _, ok := <-updates:
			if !ok {
				return
			}
			for more := true; more; {
				select {
				case _, ok := <-updates:
					if !ok {
						report()
						return
					}
				default:
					more = false
				}
			}
			report()
		}
	}
}
