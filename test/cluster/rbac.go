package cluster

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"
)

// The service accounts deploy/base gives the node agents and the cloud
// hook's controller.
const (
	NodeAgentServiceAccount  = "onehop"
	ControllerServiceAccount = "onehop-controller"
	// AgentNamespace is where both run.
	AgentNamespace = "kube-system"
)

// ApplyRBAC creates the access-control objects of deploy/base, as
// `kubectl apply -k deploy/` would: Namespaces, ServiceAccounts, (Cluster)Roles
// and their bindings, ValidatingAdmissionPolicies and their bindings, read
// from the files deploy/base/kustomization.yaml lists. Workloads and
// ConfigMaps are left out: the tests run the agents themselves. It returns
// once the admission policies are in force in the manifests' namespaces.
func (cp *ControlPlane) ApplyRBAC(ctx context.Context) error {
	objs, err := DeployObjects()
	if err != nil {
		return err
	}
	c, err := cp.Client()
	if err != nil {
		return err
	}
	var namespaces []string
	policies := false
	for _, o := range objs {
		var err error
		switch o := o.(type) {
		case *corev1.Namespace:
			_, err = c.CoreV1().Namespaces().Create(ctx, o, metav1.CreateOptions{})
			namespaces = append(namespaces, o.Name)
		case *corev1.ServiceAccount:
			_, err = c.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRole:
			_, err = c.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRoleBinding:
			_, err = c.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.Role:
			_, err = c.RbacV1().Roles(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.RoleBinding:
			_, err = c.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *admissionregistrationv1.ValidatingAdmissionPolicy:
			_, err = c.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, o, metav1.CreateOptions{})
		case *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
			_, err = c.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, o, metav1.CreateOptions{})
			policies = true
		default:
			continue
		}
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("apply %T: %w", o, err)
		}
	}
	if !policies {
		return nil
	}
	return cp.waitPoliciesInForce(ctx, namespaces)
}

// waitPoliciesInForce waits until the apiserver enforces the admission
// policies (a binding takes effect shortly after its creation, not at
// once): until a dry-run create of a Lease that is no node's own, in each
// namespace of the manifests, by the node agents' service account
// (impersonated, with a node name), is refused by a policy.
func (cp *ControlPlane) waitPoliciesInForce(ctx context.Context, namespaces []string) error {
	rc := cp.RESTConfig()
	rc.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + AgentNamespace + ":" + NodeAgentServiceAccount,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + AgentNamespace, "system:authenticated"},
		Extra:    map[string][]string{"authentication.kubernetes.io/node-name": {"probe"}},
	}
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for _, ns := range namespaces {
		probe := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "onehop-policy-probe"}}
		for {
			_, err := c.CoordinationV1().Leases(ns).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			if err != nil && strings.Contains(err.Error(), "ValidatingAdmissionPolicy") {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("admission policies not in force in namespace %s: %v (last: %v)", ns, ctx.Err(), err)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return nil
}

// DeployObjects decodes every object of the files
// deploy/base/kustomization.yaml lists under resources, in order.
func DeployObjects() ([]runtime.Object, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	base := filepath.Join(root, "deploy", "base")
	raw, err := os.ReadFile(filepath.Join(base, "kustomization.yaml"))
	if err != nil {
		return nil, err
	}
	var k struct {
		Resources []string `json:"resources"`
	}
	if err := yaml.Unmarshal(raw, &k); err != nil {
		return nil, fmt.Errorf("deploy/base/kustomization.yaml: %w", err)
	}
	// client-go's scheme and the CRDs' kind.
	sch := runtime.NewScheme()
	if err := scheme.AddToScheme(sch); err != nil {
		return nil, err
	}
	if err := apiextensionsv1.AddToScheme(sch); err != nil {
		return nil, err
	}
	codecs := serializer.NewCodecFactory(sch)
	var out []runtime.Object
	for _, f := range k.Resources {
		b, err := os.ReadFile(filepath.Join(base, f))
		if err != nil {
			return nil, err
		}
		for i, doc := range bytes.Split(b, []byte("\n---\n")) {
			js, err := yaml.YAMLToJSON(doc)
			if err != nil {
				return nil, fmt.Errorf("deploy/base/%s, document %d: %w", f, i+1, err)
			}
			if s := strings.TrimSpace(string(js)); s == "null" || s == "{}" {
				continue
			}
			o, _, err := codecs.UniversalDeserializer().Decode(js, nil, nil)
			if err != nil {
				return nil, fmt.Errorf("deploy/base/%s, document %d: %w", f, i+1, err)
			}
			out = append(out, o)
		}
	}
	return out, nil
}

// Identity is a service account as a pod on a node holds it.
type Identity struct {
	// Config authenticates with the pod's token and dials from inside the
	// control plane's namespace (as RESTConfig).
	Config *rest.Config
	// Kubeconfig is a file with the same credentials, for a process in a
	// namespace routed to the control plane's address.
	Kubeconfig string
	// Username is the service account's user name.
	Username string
}

// PodIdentity returns the credentials the kubelet would give a pod named
// pod, running as serviceAccount of namespace on node: it creates the Pod
// (spec.nodeName set, no kubelet needed) unless it exists, then requests a
// token bound to it. The apiserver puts the node's name into such a token
// (user extra authentication.kubernetes.io/node-name), as for real pods.
func (cp *ControlPlane) PodIdentity(ctx context.Context, namespace, serviceAccount, pod, node string) (*Identity, error) {
	c, err := cp.Client()
	if err != nil {
		return nil, err
	}
	p, err := c.CoreV1().Pods(namespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: pod},
		Spec: corev1.PodSpec{ServiceAccountName: serviceAccount, NodeName: node,
			Containers: []corev1.Container{{Name: "agent", Image: "onehop/agent"}}},
	}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		p, err = c.CoreV1().Pods(namespace).Get(ctx, pod, metav1.GetOptions{})
	}
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s: %w", namespace, pod, err)
	}
	secs := int64(3600)
	tr, err := c.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, serviceAccount, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: &secs,
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("token for %s/%s bound to pod %s: %w", namespace, serviceAccount, pod, err)
	}
	rc := cp.RESTConfig()
	rc.TLSClientConfig = rest.TLSClientConfig{CAData: rc.CAData}
	rc.BearerToken = tr.Status.Token
	id := &Identity{Config: rc, Username: "system:serviceaccount:" + namespace + ":" + serviceAccount,
		Kubeconfig: filepath.Join(cp.Dir, "sa-"+namespace+"-"+pod+".kubeconfig")}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["onehop"] = &clientcmdapi.Cluster{Server: cp.URL, CertificateAuthorityData: rc.CAData}
	kc.AuthInfos[serviceAccount] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	kc.Contexts["onehop"] = &clientcmdapi.Context{Cluster: "onehop", AuthInfo: serviceAccount}
	kc.CurrentContext = "onehop"
	if err := clientcmd.WriteToFile(*kc, id.Kubeconfig); err != nil {
		return nil, err
	}
	return id, nil
}
