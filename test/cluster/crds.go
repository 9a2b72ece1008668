package cluster

import (
	"context"
	"fmt"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// InstallCRDs creates the CustomResourceDefinitions of deploy/base (the
// cloud hook's onehop.io resources) and returns once the apiserver serves
// them.
func (cp *ControlPlane) InstallCRDs(ctx context.Context) error {
	objs, err := DeployObjects()
	if err != nil {
		return err
	}
	c, err := apiextensionsclient.NewForConfig(cp.RESTConfig())
	if err != nil {
		return err
	}
	crds := c.ApiextensionsV1().CustomResourceDefinitions()
	var names []string
	for _, o := range objs {
		crd, ok := o.(*apiextensionsv1.CustomResourceDefinition)
		if !ok {
			continue
		}
		if _, err := crds.Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create CRD %s: %w", crd.Name, err)
		}
		names = append(names, crd.Name)
	}
	if len(names) == 0 {
		return fmt.Errorf("deploy/base lists no CustomResourceDefinition")
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for _, n := range names {
		for {
			crd, err := crds.Get(ctx, n, metav1.GetOptions{})
			if err == nil && established(crd) {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("CRD %s not established: %v (last: %v)", n, ctx.Err(), err)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return nil
}

func established(crd *apiextensionsv1.CustomResourceDefinition) bool {
	for _, c := range crd.Status.Conditions {
		if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
			return true
		}
	}
	return false
}
