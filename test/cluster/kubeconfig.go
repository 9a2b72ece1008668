package cluster

import (
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// writeKubeconfig writes a self-contained admin kubeconfig for server.
func writeKubeconfig(path, server string, p *pki) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["onehop"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: p.caPEM}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: p.adminCertPEM, ClientKeyData: p.adminKeyPEM}
	cfg.Contexts["onehop"] = &clientcmdapi.Context{Cluster: "onehop", AuthInfo: "admin"}
	cfg.CurrentContext = "onehop"
	return clientcmd.WriteToFile(*cfg, path)
}
