// Package ipvs is onehop's IPVS dataplane.
package ipvs
