package bgp

import (
	"context"
	"errors"
	"fmt"

	"github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
)

// Learned is what a speaker holds of the routes its peers sent it.
type Learned struct {
	// Received counts the routes as GoBGP keeps them on arrival, before
	// the import policy: every peer's Adj-RIB-In, each family of which
	// holds at most the peer's MaxPrefixes (more ends the session, which
	// empties it).
	Received int
	// Accepted counts the peers' routes in the speaker's RIB, after the
	// import policy: those it could pass on.
	Accepted int
}

// Learned reports what the speaker holds of its peers' routes now.
func (s *Speaker) Learned(ctx context.Context) (Learned, error) {
	s.mu.Lock()
	srv, stopped, peers := s.srv, s.stopped, s.cfg.Peers
	families := s.families()
	s.mu.Unlock()
	if stopped || srv == nil {
		return Learned{}, errors.New("bgp: speaker not running")
	}
	var l Learned
	for _, p := range peers {
		for _, f := range families {
			t, err := srv.GetTable(ctx, &api.GetTableRequest{TableType: api.TableType_TABLE_TYPE_ADJ_IN, Name: p.Address, Family: f})
			if err != nil {
				return Learned{}, fmt.Errorf("bgp: routes from %s: %w", p.Address, err)
			}
			l.Received += int(t.NumPath)
		}
	}
	for _, f := range families {
		family := bgp.NewFamily(uint16(f.Afi), uint8(f.Safi))
		err := srv.ListPath(apiutil.ListPathRequest{TableType: api.TableType_TABLE_TYPE_GLOBAL, Family: family},
			func(_ bgp.NLRI, paths []*apiutil.Path) {
				for _, p := range paths {
					if p.PeerAddress.IsValid() { // the node's own have none
						l.Accepted++
					}
				}
			})
		if err != nil {
			return Learned{}, fmt.Errorf("bgp: list %s routes: %w", family, err)
		}
	}
	return l, nil
}
