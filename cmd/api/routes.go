package main

import (
	"github.com/gin-gonic/gin"

	"seckill/internal/auth"
	"seckill/internal/order"
	"seckill/internal/voucher"
)

// addRoutes lists the whole HTTP surface.
func addRoutes(r *gin.Engine, signer *auth.Signer, vouchers *voucher.HTTP, orders *order.HTTP, health *health) {
	r.GET("/healthz", health.live)
	r.GET("/readyz", health.ready)

	api := r.Group("/api/v1", signer.Middleware())
	api.GET("/vouchers", vouchers.List)
	api.GET("/vouchers/:id", vouchers.Show)
	api.POST("/vouchers", auth.RequireAdmin(), vouchers.Create)
	api.POST("/vouchers/:id/orders", vouchers.Purchase)
	api.GET("/orders/:id", orders.Show)
	api.GET("/users/me/orders", orders.Mine)
}
