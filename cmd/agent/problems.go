package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/onehop/onehop/portal"
)

// problemsEvery bounds how often the controller rebuilds the model of
// the changed Services to find their problems.
const problemsEvery = time.Second

// reportServiceProblems runs the model of every Service, for no node in
// particular, and puts each problem it finds (an externalIP outside the
// allowed CIDRs, a port claimed twice, a Service over a size limit, ...) on
// its Service as an event, once while it lasts. Every node would find the
// same problems; in a split install the node agents only log them, so a
// refused Service gets one event from here instead of one per node.
func reportServiceProblems(ctx context.Context, client kubernetes.Interface, cfg portal.Config, log *slog.Logger) error {
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	rec := broadcaster.NewRecorder(scheme.Scheme, v1.EventSource{Component: "onehop-controller"})

	wake := make(chan struct{}, 1)
	tracker := portal.NewTracker(cfg, &portal.EventReporter{Recorder: rec, Log: log}, func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	})
	synced, err := (&portal.Informers{Client: client, ServiceProxyName: cfg.ServiceProxyName}).Start(ctx, tracker)
	if err != nil {
		return err
	}
	if err := portal.WaitForSync(ctx, synced); err != nil {
		return err
	}
	for {
		tracker.Snapshot()
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(problemsEvery):
		}
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
		}
	}
}

// separateController reports whether the config file's external section
// leaves the cluster-wide part to `agent controller`.
func separateController(external json.RawMessage) bool {
	var ec struct {
		SeparateController bool `json:"separateController"`
	}
	return len(external) > 0 && json.Unmarshal(external, &ec) == nil && ec.SeparateController
}
