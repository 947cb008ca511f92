// Command allocator times the Kubernetes structured DRA allocator (k8s.io/dynamic-resource-allocation,
// the code kube-scheduler 1.36 runs in its DynamicResources plugin) on the slices a benchmark
// hands it, without the rest of the scheduler: no queue, no API, no other plugins.
//
// Input (JSON on stdin): {"modes": [{"name", "class", "nodes": [names], "slices": [ResourceSlice]}],
// "classes": [DeviceClass], "pods": P}. For each mode and each of P Pods it does what the
// plugin does for one Pod with one claim: one NewAllocator over every slice of the cluster
// (PreFilter), then Allocate on every node in turn (Filter; the scheduler stops after enough
// feasible nodes, this walks them all so that every node costs the same), after one untimed
// Pod that compiles the class's CEL selector (the plugin caches it too). It prints, per mode,
// the microseconds per node of Allocate and the milliseconds of NewAllocator per Pod.
//
// Not for: the scheduler's other costs (queueing, binding, API writes): benchmarks/bench_scheduler.py
// measures the whole. Run it through benchmarks/bench_allocator.py, which builds the input.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
)

type mode struct {
	Name   string                       `json:"name"`
	Class  string                       `json:"class"`
	Nodes  []string                     `json:"nodes"`
	Slices []*resourceapi.ResourceSlice `json:"slices"`
}

type input struct {
	Modes   []mode                     `json:"modes"`
	Classes []*resourceapi.DeviceClass `json:"classes"`
	Pods    int                        `json:"pods"`
}

// classes is the DeviceClassLister the allocator reads classes through.
type classes map[string]*resourceapi.DeviceClass

func (c classes) List() ([]*resourceapi.DeviceClass, error) {
	out := make([]*resourceapi.DeviceClass, 0, len(c))
	for _, class := range c {
		out = append(out, class)
	}
	return out, nil
}

func (c classes) Get(name string) (*resourceapi.DeviceClass, error) {
	if class, ok := c[name]; ok {
		return class, nil
	}
	return nil, fmt.Errorf("no DeviceClass %q", name)
}

func claim(class string) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "bench", UID: "c-uid"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{
			{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}},
		}}},
	}
}

func run(ctx context.Context, m mode, lister classes, pods int) error {
	// The gates kube-scheduler 1.36 has on by default (its AllocatorFeatures).
	features := structured.Features{AdminAccess: true, PrioritizedList: true, PartitionableDevices: true,
		DeviceTaints: true, DeviceBindingAndStatus: true, ConsumableCapacity: true}
	cache := cel.NewCache(10, cel.Features{EnableConsumableCapacity: true})
	nodes := make([]*v1.Node, len(m.Nodes))
	for i, name := range m.Nodes {
		nodes[i] = &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	}
	claims := []*resourceapi.ResourceClaim{claim(m.Class)}
	state := structured.AllocatedState{AllocatedDevices: sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection()}
	var setUp, allocate time.Duration
	for pod := -1; pod < pods; pod++ { // Pod -1 warms up (compiles the class's CEL) and is not timed
		if pod == 0 {
			setUp, allocate = 0, 0
		}
		start := time.Now()
		allocator, err := structured.NewAllocator(ctx, features, state, lister, m.Slices, cache)
		if err != nil {
			return err
		}
		setUp += time.Since(start)
		start = time.Now()
		for _, node := range nodes {
			results, err := allocator.Allocate(ctx, node, claims)
			if err != nil {
				return fmt.Errorf("%s on %s: %w", m.Name, node.Name, err)
			}
			if len(results) != 1 {
				return fmt.Errorf("%s: node %s gave no allocation: the slices or the class are wrong", m.Name, node.Name)
			}
		}
		allocate += time.Since(start)
	}
	perNode := float64(allocate.Microseconds()) / float64(pods*len(nodes))
	fmt.Printf("allocator %s N=%d: %.1f us per node (Allocate), NewAllocator %.2f ms per Pod, %d slices\n",
		m.Name, len(nodes), perNode, float64(setUp.Microseconds())/1000/float64(pods), len(m.Slices))
	return nil
}

func main() {
	var in input
	if err := json.NewDecoder(os.Stdin).Decode(&in); err != nil {
		fmt.Fprintln(os.Stderr, "reading the input:", err)
		os.Exit(2)
	}
	lister := classes{}
	for _, class := range in.Classes {
		lister[class.Name] = class
	}
	ctx := context.Background()
	for _, m := range in.Modes {
		if err := run(ctx, m, lister, in.Pods); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}
