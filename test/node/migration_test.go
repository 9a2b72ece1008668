package node_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/onehop/onehop/test/cluster"
	"github.com/onehop/onehop/test/node"
	"github.com/onehop/onehop/test/nsutil"
)

// docBlock is a fenced block of docs/migration.md.
type docBlock struct {
	lang, text string
}

// migrationBlocks returns the fenced blocks of a section of
// docs/migration.md, in order.
func migrationBlocks(t *testing.T, heading string) []docBlock {
	t.Helper()
	root, err := cluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "docs", "migration.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	start := strings.Index(doc, "\n"+heading+"\n")
	if start < 0 {
		t.Fatalf("docs/migration.md has no section %q", heading)
	}
	section := doc[start+len(heading)+2:]
	for _, next := range []string{"\n## ", "\n### "} {
		if end := strings.Index(section, next); end >= 0 {
			section = section[:end]
		}
	}
	var blocks []docBlock
	var cur *docBlock
	for _, line := range strings.Split(section, "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case cur == nil && strings.HasPrefix(trimmed, "```"):
			cur = &docBlock{lang: strings.TrimPrefix(trimmed, "```")}
		case cur != nil && trimmed == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.text += strings.TrimPrefix(line, "   ") + "\n"
		}
	}
	return blocks
}

// migrationStep runs the kubectl lines of a sh block as written, with the
// paths a reader would have (deploy/, onehop-cleanup.yaml) pointing at the
// test's files. Lines that are not kubectl (commands for a node's shell)
// are not run here.
func migrationStep(ctx context.Context, t *testing.T, c *node.Cluster, block docBlock, paths map[string]string) {
	t.Helper()
	for _, line := range strings.Split(block.text, "\n") {
		if i := strings.Index(line, "#"); i >= 0 {
			line = line[:i]
		}
		args := strings.Fields(line)
		if len(args) == 0 || args[0] != "kubectl" {
			continue
		}
		for i, a := range args {
			if p, ok := paths[a]; ok {
				args[i] = p
			}
		}
		began := time.Now()
		out, err := c.Kubectl(ctx, args[1:]...)
		if err != nil {
			t.Fatalf("%s: %v\n%s", strings.TrimSpace(line), err, out)
		}
		t.Logf("$ %s  (%v)\n%s", strings.TrimSpace(line), time.Since(began).Round(time.Millisecond), strings.TrimSpace(out))
	}
}

// nftTables lists a node's nftables tables.
func nftTables(ctx context.Context, t *testing.T, n *node.Node) string {
	t.Helper()
	out, err := nsutil.Exec(ctx, n.Name, "nft", "list", "tables")
	if err != nil {
		t.Fatalf("nft list tables on %s: %v\n%s", n.Name, err, out)
	}
	return out
}

// The migration guide (docs/migration.md, "Replacing kube-proxy"), executed
// as written on two real nodes that run kube-proxy's DaemonSet, and then its
// way back, under request loops (to the cluster IP from both nodes, and to a
// NodePort from outside): no request fails, each step leaves the rules the
// guide says, and no request of onehop's is forbidden.
func TestMigrationGuide(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	bin, err := node.Binaries(ctx)
	if err != nil {
		t.Fatal(err)
	}
	blocks := migrationBlocks(t, "## Replacing kube-proxy")
	var patchBlock, cleanupBlock docBlock
	var shBlocks []docBlock
	for _, b := range blocks {
		switch {
		case b.lang == "yaml" && strings.HasPrefix(b.text, "patches:"):
			patchBlock = b
		case b.lang == "yaml" && strings.Contains(b.text, "name: onehop-cleanup"):
			cleanupBlock = b
		case b.lang == "sh" && strings.Contains(b.text, "kubectl"):
			shBlocks = append(shBlocks, b)
		}
	}
	if patchBlock.text == "" || cleanupBlock.text == "" || len(shBlocks) < 3 {
		t.Fatalf("docs/migration.md: want the patch, the cleanup DaemonSet and the kubectl steps; found %d blocks", len(blocks))
	}
	var cleanupImage string
	for _, line := range strings.Split(cleanupBlock.text, "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "image:" && strings.HasPrefix(f[1], "onehop/agent:") {
			cleanupImage = f[1]
		}
	}
	if cleanupImage == "" {
		t.Fatal("docs/migration.md: the cleanup DaemonSet names no onehop/agent image")
	}

	dir := t.TempDir()
	images := []string{filepath.Join(dir, "agnhost.tar"), filepath.Join(dir, "agent.tar"), filepath.Join(dir, "agent-ipvs.tar"), filepath.Join(dir, "kube-proxy.tar")}
	if err := node.BuildAgnhostImage(bin, images[0]); err != nil {
		t.Fatal(err)
	}
	if err := node.BuildAgentImage(ctx, "onehop.test/agent:v1", images[1]); err != nil {
		t.Fatal(err)
	}
	// The guide's own image name: the cleanup runs the image it names.
	if err := node.BuildAgentIPVSImage(ctx, "docker.io/"+cleanupImage, images[2]); err != nil {
		t.Fatal(err)
	}
	if err := node.BuildKubeProxyImage(bin, images[3]); err != nil {
		t.Fatal(err)
	}
	c := node.Start(t, node.Options{Nodes: 2, Images: images})
	client := c.Client(t)
	c.DeployKubeProxy(t)

	for i, n := range c.Nodes {
		createWebPod(ctx, t, client, "web-"+strconv.Itoa(i), n.Name)
	}
	svc := createWebService(ctx, t, client)
	for i := range c.Nodes {
		node.WaitPodRunning(t, client, "default", "web-"+strconv.Itoa(i))
	}
	vip, nodePort := svc.Spec.ClusterIP, strconv.Itoa(int(svc.Spec.Ports[0].NodePort))
	for _, n := range c.Nodes {
		if out, err := nsutil.Exec(ctx, n.Name, "curl", "-sS", "--max-time", "2", "--retry", "20", "--retry-all-errors", "--retry-delay", "1", "http://"+vip+"/hostname"); err != nil {
			t.Fatalf("kube-proxy does not serve %s on %s: %v %s", vip, n.Name, err, out)
		}
		if tables := nftTables(ctx, t, n); !strings.Contains(tables, "table ip kube-proxy") {
			t.Fatalf("kube-proxy's table is not on %s:\n%s", n.Name, tables)
		}
	}

	var loops []*node.RequestLoop
	for _, n := range c.Nodes {
		loops = append(loops, node.StartRequestLoop(n.Name, "http://"+vip+"/hostname", 20*time.Millisecond))
	}
	loops = append(loops, node.StartRequestLoop(c.Netns, "http://"+c.Nodes[0].IP+":"+nodePort+"/hostname", 20*time.Millisecond))
	time.Sleep(time.Second)

	// Step 1: the kustomization points the DaemonSet at kube-proxy's
	// ConfigMap, with the guide's patch.
	var patch struct {
		Patches []map[string]any `json:"patches"`
	}
	if err := yaml.Unmarshal([]byte(patchBlock.text), &patch); err != nil || len(patch.Patches) == 0 {
		t.Fatalf("the guide's patch does not parse: %v\n%s", err, patchBlock.text)
	}
	overlay := c.Overlay(t, "deploy", "onehop.test/agent:v1", patch.Patches...)
	cleanupFile := filepath.Join(dir, "onehop-cleanup.yaml")
	if err := os.WriteFile(cleanupFile, []byte(cleanupBlock.text), 0o644); err != nil {
		t.Fatal(err)
	}
	removeFile := filepath.Join(dir, "onehop-remove.yaml")
	paths := map[string]string{"deploy/": overlay, "onehop-cleanup.yaml": cleanupFile, "onehop-remove.yaml": removeFile}
	// Steps 2 (stop kube-proxy), 3 (start onehop) and 4 (the leftovers).
	for _, b := range shBlocks {
		migrationStep(ctx, t, c, b, paths)
	}
	for _, n := range c.Nodes {
		tables := nftTables(ctx, t, n)
		if strings.Contains(tables, "kube-proxy") || !strings.Contains(tables, "table inet onehop") {
			t.Errorf("after the guide's steps, node %s has:\n%s", n.Name, tables)
		}
	}
	time.Sleep(2 * time.Second)
	stopLoops(t, "migration", loops)

	// The way back, as the guide says.
	loops = loops[:0]
	for _, n := range c.Nodes {
		loops = append(loops, node.StartRequestLoop(n.Name, "http://"+vip+"/hostname", 20*time.Millisecond))
	}
	loops = append(loops, node.StartRequestLoop(c.Netns, "http://"+c.Nodes[0].IP+":"+nodePort+"/hostname", 20*time.Millisecond))
	time.Sleep(time.Second)
	for _, b := range migrationBlocks(t, "### Going back") {
		switch {
		case b.lang == "yaml" && strings.Contains(b.text, "name: onehop-remove"):
			if !strings.Contains(b.text, "image: "+cleanupImage+"\n") {
				t.Fatalf("the way back runs another image than step 4's %s:\n%s", cleanupImage, b.text)
			}
			if err := os.WriteFile(removeFile, []byte(b.text), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		case b.lang != "sh":
			continue
		case strings.Contains(b.text, "kubeadm init phase addon kube-proxy"):
			// The installer's step; here, the manifest kube-proxy first
			// ran from.
			c.DeployKubeProxy(t)
		}
		migrationStep(ctx, t, c, b, paths)
	}
	for _, n := range c.Nodes {
		tables := nftTables(ctx, t, n)
		if !strings.Contains(tables, "table ip kube-proxy") || strings.Contains(tables, "onehop") {
			t.Errorf("after the way back, node %s has:\n%s", n.Name, tables)
		}
	}
	time.Sleep(2 * time.Second)
	stopLoops(t, "way back", loops)

	if refused := c.Forbidden(t, "system:serviceaccount:kube-system:onehop"); len(refused) > 0 {
		t.Errorf("the API server refused %d requests of the agents, e.g. %+v", len(refused), refused[0])
	}
}

func stopLoops(t *testing.T, phase string, loops []*node.RequestLoop) {
	t.Helper()
	for i, l := range loops {
		ok, answers, failures := l.Stop()
		t.Logf("%s, request loop %d: %d answered %v, %d failed", phase, i, ok, answers, len(failures))
		if len(failures) > 0 {
			t.Errorf("%s, request loop %d: %d failed: %v", phase, i, len(failures), failures[:min(len(failures), 10)])
		}
		if ok < 20 {
			t.Errorf("%s, request loop %d: only %d answers", phase, i, ok)
		}
	}
}
